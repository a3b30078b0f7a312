"""OpenAI chat request → GenerateCommand, rejecting what cannot be honoured with a clear 400."""

from collections.abc import Sequence
from typing import Protocol

from pydantic import JsonValue

from exo.api.adapters.field_policy import log_ignored
from exo.api.adapters.json_output import json_output
from exo.api.adapters.tool_controls import (
    allowed_tool_names,
    build_policy,
    check_enforced_schemas,
    check_functions,
)
from exo.api.errors import ApiError
from exo.api.types.openai_chat import (
    AllowedToolsChoice,
    ChatCompletionRequest,
    ChatMessage,
    ContentPart,
    FunctionDefinition,
    JsonObjectResponseFormat,
    JsonSchemaResponseFormat,
    NamedToolChoice,
    TextContentPart,
    TextResponseFormat,
    ToolCall,
    ToolChoice,
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

# Request fields accepted for compatibility but not acted on: clients such as opencode, the AI SDK or scripts
# written for vLLM send them routinely, and rejecting them would break those clients for no benefit. Each one has no
# effect on a single local completion (user, store, metadata…); docs/OPERATIONS.md lists them.
IGNORED_REQUEST_FIELDS = (
    "reasoning_effort",
    "verbosity",
    "top_logprobs",
    "user",
    "metadata",
    "store",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
)


def _content_text(content: str | list[ContentPart] | None, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts: list[str] = []
    for position, part in enumerate(content):
        if not isinstance(part, TextContentPart):
            if part.type == "text":
                field = f"{where}.content[{position}].text"
                raise ApiError(400, f"{field}: a text part needs a 'text' string", param=field)
            raise ApiError(
                400,
                f"{where}.content[{position}]: content parts of type '{part.type}' are not supported (only 'text')",
                param=f"{where}.content",
                code="unsupported_content_type",
            )
        texts.append(part.text)
    return "".join(texts)


def _tool_call(call: ToolCall) -> PromptToolCall:
    # Arguments that are not JSON (a call the model cut off at max_tokens, sent back by the agent) are kept as
    # text: OpenAI accepts them, and the template renders the string as the model wrote it.
    return PromptToolCall(call_id=call.id or "", name=call.function.name, arguments=call.function.arguments)


def normalise_messages(messages: Sequence[ChatMessage]) -> tuple[PromptMessage, ...]:
    """Validate history and normalise it for templates (content parts joined, `developer` → `system`)."""
    if not messages:
        raise ApiError(400, "messages must contain at least one message", param="messages")
    known_call_ids: set[str] = set()
    result: list[PromptMessage] = []
    for position, message in enumerate(messages):
        where = f"messages[{position}]"
        calls = tuple(_tool_call(call) for call in message.tool_calls or [])
        known_call_ids.update(call.call_id for call in calls if call.call_id)
        if message.role == "tool":
            if not message.tool_call_id:
                raise ApiError(400, f"{where}: a message with role 'tool' needs a tool_call_id", param=where)
            if message.tool_call_id not in known_call_ids:
                raise ApiError(
                    400,
                    f"{where}: tool_call_id '{message.tool_call_id}' does not match any earlier assistant tool call",
                    param=f"{where}.tool_call_id",
                )
        result.append(
            PromptMessage(
                role="system" if message.role == "developer" else message.role,
                content=_content_text(message.content, where),
                reasoning_content=message.reasoning_content,
                tool_calls=calls,
                tool_call_id=message.tool_call_id,
                name=message.name,
            )
        )
    return tuple(result)


class FunctionTool(Protocol):
    """A tool in OpenAI's chat shape, `{"type": "function", "function": {...}}` (Ollama's tools have it too)."""

    @property
    def type(self) -> str: ...

    @property
    def function(self) -> FunctionDefinition: ...


def _check_tools(tools: Sequence[FunctionTool]) -> tuple[ToolSpec, ...]:
    for position, tool in enumerate(tools):
        if tool.type != "function":
            where = f"tools[{position}].type"
            raise ApiError(400, f"{where} must be 'function', got '{tool.type}'", param=where)
    return check_functions([tool.function.tool_spec() for tool in tools], field_prefix="function.")


def tool_policy(request: ChatCompletionRequest) -> ToolPolicy:
    """Decide what the model may do with tools from `tools`, `tool_choice` and `parallel_tool_calls`."""
    return openai_tool_policy(
        request.tools or [], request.tool_choice, parallel=request.parallel_tool_calls is not False
    )


def openai_tool_policy(tools_sent: Sequence[FunctionTool], choice: ToolChoice | None, *, parallel: bool) -> ToolPolicy:
    """The policy for OpenAI's `tools` and `tool_choice` values (`auto`, `none`, `required`, a named function,
    `allowed_tools`), whichever dialect carried them."""
    tools = _check_tools(tools_sent)
    match choice:
        case None | "auto":
            return build_policy(tools, "auto", parallel_tool_calls=parallel)
        case "none" | "required" as mode:
            return build_policy(tools, mode, parallel_tool_calls=parallel)
        case NamedToolChoice(function=function):
            return build_policy(tools, "named", callable_tools=(function.name,))
        case AllowedToolsChoice(allowed_tools=allowed):
            param = "tool_choice.allowed_tools"
            names = allowed_tool_names(allowed.tools, {tool.name for tool in tools}, param) if tools else ()
            return build_policy(tools, allowed.mode, callable_tools=names, parallel_tool_calls=parallel)


def sampling_params(request: ChatCompletionRequest) -> SamplingParams:
    """The sampling settings (their ranges were checked with the request's schema; `top_k` against the model's
    vocabulary when the command is submitted)."""
    max_tokens = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
    if request.n is not None and request.n != 1:
        raise ApiError(400, "only n=1 is supported", param="n")
    stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    return SamplingParams(
        temperature=request.temperature if request.temperature is not None else 0.0,
        top_p=request.top_p if request.top_p is not None else 1.0,
        top_k=max(request.top_k or 0, 0),
        min_p=request.min_p or 0.0,
        repetition_penalty=request.repetition_penalty,
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        seed=request.seed,
        max_tokens=max_tokens,
        stop=tuple(stop),
    )


# Template variables exo sets itself: a client overriding them would break the prompt (and tool) rendering.
_RESERVED_TEMPLATE_KWARGS = frozenset(
    {"messages", "conversation", "tools", "documents", "add_generation_prompt", "continue_final_message", "tokenize"}
)


def chat_template_kwargs(request: ChatCompletionRequest) -> dict[str, JsonValue]:
    """The client's extra chat-template variables (e.g. `enable_thinking`), minus the ones exo must control."""
    kwargs = dict(request.chat_template_kwargs or {})
    reserved = sorted(_RESERVED_TEMPLATE_KWARGS.intersection(kwargs))
    if reserved:
        raise ApiError(
            400,
            f"chat_template_kwargs may not set {', '.join(reserved)}: exo renders those from the request itself",
            param="chat_template_kwargs",
        )
    return kwargs


def structured_output(request: ChatCompletionRequest) -> StructuredOutput | None:
    """The JSON the reply's content must be (`response_format` json_object / json_schema), schema checked here.

    A schema that is not valid JSON Schema is a 400 naming the problem; what is valid but beyond llguidance (such
    as a `$ref` to nowhere) is refused by the runner when it compiles the grammar, also as a 400.
    """
    match request.response_format:
        case None | TextResponseFormat():
            return None
        case JsonObjectResponseFormat():
            return StructuredOutput(json_schema={"type": "object"})
        case JsonSchemaResponseFormat(json_schema=spec):
            where = "response_format.json_schema.schema"
            return json_output(spec.schema_, strict=spec.strict is True, where=where)


def reject_unsupported_features(request: ChatCompletionRequest) -> None:
    """400 for fields that would change the answer in ways we cannot honour (rather than silently ignoring them)."""
    if request.logprobs:
        raise ApiError(400, "logprobs are not supported", param="logprobs", code="unsupported_parameter")
    if request.logit_bias:
        raise ApiError(400, "logit_bias is not supported", param="logit_bias", code="unsupported_parameter")


def to_command(request: ChatCompletionRequest, model_id: ModelId) -> GenerateCommand:
    """Validate `request` (400 ApiError for anything we cannot honour) and turn it into a command for `model_id`."""
    reject_unsupported_features(request)
    log_ignored(request, IGNORED_REQUEST_FIELDS)
    extensions = {
        "auto_grammar": request.auto_tool_grammar,
        "loop_guard": request.loop_guard,
        "repair": request.tool_call_repair,
    }
    policy = tool_policy(request).model_copy(update=extensions)
    check_enforced_schemas(policy, field_prefix="function.")
    params = GenerationParams(
        messages=normalise_messages(request.messages),
        tool_policy=policy,
        sampling=sampling_params(request),
        chat_template_kwargs=chat_template_kwargs(request),
        structured_output=structured_output(request),
    )
    return GenerateCommand(command_id=new_command_id(), model_id=model_id, params=params)
