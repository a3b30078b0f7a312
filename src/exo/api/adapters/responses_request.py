"""OpenAI Responses request → GenerateCommand: the same command a chat completion becomes.

`instructions` and input items map onto the normalised history Chat Completions produces (function_call items
→ assistant tool calls, function_call_output → tool messages, reasoning items → reasoning_content of the
assistant turn that follows), so the model's chat template renders them exactly as it renders a chat request.
Nothing is stored: what needs server-side state (`previous_response_id`, `conversation`, item references) or a
hosted tool is a 400 naming the field, never silently dropped.
"""

from collections.abc import Sequence

from pydantic import JsonValue

from exo.api.adapters.field_policy import log_ignored, unsupported
from exo.api.adapters.json_output import json_output
from exo.api.adapters.token_count import count_command as count_only
from exo.api.adapters.tool_controls import (
    allowed_tool_names,
    build_policy,
    check_enforced_schemas,
    check_functions,
)
from exo.api.errors import ApiError
from exo.api.types.openai_responses import (
    AllowedToolsChoice,
    ContentPart,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    FunctionToolChoice,
    InputTextPart,
    MessageItem,
    OtherEntry,
    OutputTextPart,
    ReasoningItem,
    RefusalPart,
    ResponsesPrompt,
    ResponsesRequest,
)
from exo.shared.types.commands import GenerateCommand
from exo.shared.types.common import ModelId, new_command_id
from exo.shared.types.tasks import (
    GenerationParams,
    PromptMessage,
    PromptToolCall,
    SamplingParams,
    StructuredOutput,
    ToolPolicy,
)
from exo.shared.types.tool_spec import ToolSpec

# Accepted, not acted on: none changes what one local completion generates (docs/AGENTS.md lists them, with
# `reasoning.summary`, `text.verbosity` and the `include` values other than logprobs).
IGNORED_RESPONSES_FIELDS = (
    "store",
    "metadata",
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "service_tier",
    "client_metadata",
    "stream_options",
)
_STATELESS = "it keeps no responses; send the whole conversation in `input`"


def _part_text(part: ContentPart, where: str) -> str:
    match part:
        case InputTextPart(text=text) | OutputTextPart(text=text):
            return text
        case RefusalPart(refusal=refusal):
            return refusal
        case OtherEntry(type=kind):
            if kind in ("input_image", "input_file", "input_audio"):
                raise unsupported(where, f"{kind} content", "the served models read text only")
            raise unsupported(where, f"content parts of type '{kind}'")


def _text(content: str | Sequence[ContentPart], where: str) -> str:
    if isinstance(content, str):
        return content
    return "".join(_part_text(part, f"{where}[{position}]") for position, part in enumerate(content))


def _reasoning_text(item: ReasoningItem, where: str) -> str:
    texts = [part.text for part in item.content or ()] or [part.text for part in item.summary]
    if not texts and item.encrypted_content:
        raise unsupported(f"{where}.encrypted_content", "encrypted reasoning", "only its issuer can read it")
    return "\n\n".join(texts)


class _History:
    """Builds the normalised history item by item; calls join the assistant turn they follow."""

    def __init__(self) -> None:
        self.messages: list[PromptMessage] = []
        self.known_call_ids: set[str] = set()
        self._reasoning: list[str] = []

    def add(self, message: PromptMessage) -> None:
        if message.role == "assistant" and self._reasoning:
            message = message.model_copy(update={"reasoning_content": "\n\n".join(self._reasoning)})
            self._reasoning = []
        self.messages.append(message)

    def add_reasoning(self, text: str) -> None:
        if text:
            self._reasoning.append(text)

    def add_call(self, item: FunctionCallItem) -> None:
        call = PromptToolCall(call_id=item.call_id, name=item.name, arguments=item.arguments)
        self.known_call_ids.add(item.call_id)
        last = self.messages[-1] if self.messages else None
        if last is not None and last.role == "assistant" and not self._reasoning:
            self.messages[-1] = last.model_copy(update={"tool_calls": (*last.tool_calls, call)})
        else:
            self.add(PromptMessage(role="assistant", content="", tool_calls=(call,)))


def normalise_input(request: ResponsesPrompt) -> tuple[PromptMessage, ...]:
    """`instructions` and `input` as the normalised history every protocol renders the same way."""
    if request.previous_response_id is not None:
        raise unsupported("previous_response_id", "continuing a stored response", _STATELESS)
    if request.conversation is not None:
        raise unsupported("conversation", "stored conversations", _STATELESS)
    if request.input is None or request.input == []:
        raise ApiError(400, "input is required: a string or a non-empty list of items", param="input")
    history = _History()
    if request.instructions:
        history.add(PromptMessage(role="system", content=request.instructions))
    items = [MessageItem(role="user", content=request.input)] if isinstance(request.input, str) else request.input
    for position, item in enumerate(items):
        where = f"input[{position}]"
        match item:
            case MessageItem(role=role, content=content):
                text = _text(content, f"{where}.content")
                history.add(PromptMessage(role="system" if role == "developer" else role, content=text))
            case FunctionCallItem(namespace=namespace):
                if namespace is not None:
                    raise unsupported(f"{where}.namespace", "namespaced tools")
                history.add_call(item)
            case FunctionCallOutputItem(call_id=call_id, output=output):
                if call_id not in history.known_call_ids:
                    raise ApiError(
                        400,
                        f"{where}: call_id '{call_id}' does not match any earlier function_call item",
                        param=f"{where}.call_id",
                    )
                history.add(PromptMessage(role="tool", content=_text(output, f"{where}.output"), tool_call_id=call_id))
            case ReasoningItem():
                history.add_reasoning(_reasoning_text(item, where))
            case OtherEntry(type="item_reference"):
                raise unsupported(f"{where}.type", "item references", _STATELESS)
            case OtherEntry(type=kind):
                raise unsupported(f"{where}.type", f"input items of type '{kind}'")
    return tuple(history.messages)


def _functions(request: ResponsesPrompt) -> tuple[ToolSpec, ...]:
    functions: list[ToolSpec] = []
    for position, tool in enumerate(request.tools or []):
        where = f"tools[{position}]"
        if not isinstance(tool, FunctionTool):
            raise unsupported(f"{where}.type", f"tools of type '{tool.type}'", "only 'function' tools run here")
        if tool.defer_loading:
            raise unsupported(f"{where}.defer_loading", "deferred tool loading", "it needs server-side tool search")
        definition = ToolSpec(
            name=tool.name,
            description=tool.description,
            # The Responses API makes function tools strict unless they say otherwise.
            strict=tool.strict is not False,
        )
        if tool.parameters is not None:
            definition = definition.model_copy(update={"parameters": tool.parameters})
        functions.append(definition)
    return check_functions(functions)


def tool_policy(request: ResponsesPrompt) -> ToolPolicy:
    """`tools`, `tool_choice` and `parallel_tool_calls` as the engine's policy."""
    tools = _functions(request)
    parallel = request.parallel_tool_calls is not False
    match request.tool_choice:
        case None | "auto":
            return build_policy(tools, "auto", parallel_tool_calls=parallel)
        case "none" | "required" as mode:
            return build_policy(tools, mode, parallel_tool_calls=parallel)
        case FunctionToolChoice(name=name):
            return build_policy(tools, "named", callable_tools=(name,))
        case AllowedToolsChoice(mode=mode, tools=entries):
            names = allowed_tool_names(entries, {tool.name for tool in tools}, "tool_choice") if tools else ()
            return build_policy(tools, mode, callable_tools=names, parallel_tool_calls=parallel)
        case OtherEntry(type=kind):
            raise unsupported("tool_choice", f"a tool_choice of type '{kind}'", "only 'function' tools run here")


def _structured_output(request: ResponsesPrompt) -> StructuredOutput | None:
    output_format = request.text.format if request.text else None
    if output_format is None or output_format.type == "text":
        return None
    if output_format.type == "json_object":
        return StructuredOutput(json_schema={"type": "object"})
    if output_format.schema_ is None:
        raise ApiError(400, "text.format.schema is required for type 'json_schema'", param="text.format.schema")
    where = "text.format.schema"
    return json_output(output_format.schema_, strict=output_format.strict is True, where=where)


def _template_kwargs(request: ResponsesPrompt) -> dict[str, JsonValue]:
    # Chat templates with a thinking switch (Qwen3's `enable_thinking`) honour an explicit effort of "none".
    if request.reasoning is not None and request.reasoning.effort == "none":
        return {"enable_thinking": False}
    return {}


def prompt_params(request: ResponsesPrompt, sampling: SamplingParams) -> GenerationParams:
    """Everything that determines the prompt, checked, plus `sampling`."""
    if request.truncation == "auto":
        raise unsupported("truncation", "'auto' truncation", "a prompt that does not fit is refused, never cut")
    policy = tool_policy(request)
    check_enforced_schemas(policy)
    return GenerationParams(
        messages=normalise_input(request),
        tool_policy=policy,
        sampling=sampling,
        chat_template_kwargs=_template_kwargs(request),
        structured_output=_structured_output(request),
    )


def _reject_unsupported(request: ResponsesRequest) -> None:
    if request.background:
        raise unsupported("background", "background responses")
    if request.prompt is not None:
        raise unsupported("prompt", "stored prompt templates")
    if request.max_tool_calls is not None:
        raise unsupported("max_tool_calls", "max_tool_calls", "it limits hosted tools, which do not run here")
    if request.top_logprobs:
        raise unsupported("top_logprobs", "logprobs")
    for position, included in enumerate(request.include or []):
        if "logprobs" in included:
            raise unsupported(f"include[{position}]", "logprobs")


def sampling_params(request: ResponsesRequest) -> SamplingParams:
    if request.max_output_tokens is not None and request.max_output_tokens < 1:
        raise ApiError(
            400, f"max_output_tokens must be at least 1, got {request.max_output_tokens}", param="max_output_tokens"
        )
    return SamplingParams(
        # The same greedy default as Chat Completions, so one prompt gives one answer whatever the protocol.
        temperature=request.temperature if request.temperature is not None else 0.0,
        top_p=request.top_p if request.top_p is not None else 1.0,
        max_tokens=request.max_output_tokens,
    )


def to_command(request: ResponsesRequest, model_id: ModelId) -> GenerateCommand:
    """Validate `request` (a 400 ApiError for anything we cannot honour) and turn it into a command."""
    _reject_unsupported(request)
    log_ignored(request, IGNORED_RESPONSES_FIELDS)
    params = prompt_params(request, sampling_params(request))
    return GenerateCommand(command_id=new_command_id(), model_id=model_id, params=params)


def count_command(request: ResponsesPrompt, model_id: ModelId) -> GenerateCommand:
    """The command that renders `request`'s prompt on the model's runner and counts its tokens."""
    return count_only(prompt_params(request, SamplingParams()), model_id)
