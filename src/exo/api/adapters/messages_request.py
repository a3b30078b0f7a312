"""Anthropic Messages request → GenerateCommand: the same command a chat completion becomes.

History maps onto the normalised messages Chat Completions produces (tool_use blocks → tool calls, tool_result
blocks → tool messages, thinking blocks → reasoning_content), so it is rendered by the model's chat template
exactly as the equivalent chat request would be. What cannot be honoured (images, documents, server tools,
context edits other than clearing thinking) is a 400 naming the field, never silently dropped.
"""

from collections.abc import Sequence

from pydantic import JsonValue

from exo.api.adapters.field_policy import log_ignored, unsupported
from exo.api.adapters.json_output import json_output
from exo.api.adapters.token_count import count_command as count_only
from exo.api.adapters.tool_controls import build_policy, check_enforced_schemas, check_functions
from exo.api.errors import ApiError
from exo.api.types.anthropic_messages import (
    ContentBlockParam,
    ContextManagementParam,
    MessagesPrompt,
    MessagesRequest,
    TextBlockParam,
    ThinkingBlockParam,
    ThinkingTurns,
    ToolChoiceAny,
    ToolChoiceAuto,
    ToolChoiceNone,
    ToolChoiceTool,
    ToolResultBlockParam,
    ToolUseBlockParam,
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
# `output_config.effort` and `thinking.budget_tokens`).
IGNORED_MESSAGES_FIELDS = (
    "metadata",
    "service_tier",
    "inference_geo",
    "diagnostics",
    "user_profile_id",
    "workspace_id",
    "cache_control",
    "speed",
)
CLIENT_TOOL_TYPES = (None, "custom")
CLEAR_THINKING_EDIT = "clear_thinking_20251015"
MAX_STOP_SEQUENCES = 16
BILLING_HEADER_PREFIX = "x-anthropic-billing-header:"


def _refused_block(where: str, block_type: str, place: str) -> ApiError:
    if block_type in ("image", "document"):
        return unsupported(where, f"{block_type} input", "the served models read text only")
    return unsupported(where, f"'{block_type}' blocks in {place}")


def _blocks(content: str | Sequence[ContentBlockParam]) -> Sequence[ContentBlockParam]:
    return [TextBlockParam(type="text", text=content)] if isinstance(content, str) else content


def _text_only(content: str | Sequence[ContentBlockParam] | None, where: str) -> str:
    """The text of content that may only hold text blocks (system prompts, tool results)."""
    if content is None:
        return ""
    texts: list[str] = []
    for position, block in enumerate(_blocks(content)):
        if not isinstance(block, TextBlockParam):
            raise _refused_block(f"{where}[{position}]", block.type, "text-only content")
        texts.append(block.text)
    return "".join(texts)


def _tool_result(block: ToolResultBlockParam, where: str, known_ids: set[str]) -> PromptMessage:
    if block.tool_use_id not in known_ids:
        raise ApiError(
            400,
            f"{where}: tool_use_id '{block.tool_use_id}' does not match any earlier tool_use block",
            param=f"{where}.tool_use_id",
        )
    text = _text_only(block.content, f"{where}.content")
    # The chat template has no field for the flag, so the model reads it in the result itself.
    if block.is_error:
        text = f"Error: {text}"
    return PromptMessage(role="tool", content=text, tool_call_id=block.tool_use_id)


def _user_turn(blocks: Sequence[ContentBlockParam], where: str, known_ids: set[str]) -> list[PromptMessage]:
    """Tool results first (templates expect them right after the calls), then the user's own text, if any."""
    results: list[PromptMessage] = []
    texts: list[str] = []
    for position, block in enumerate(blocks):
        match block:
            case TextBlockParam(text=text):
                texts.append(text)
            case ToolResultBlockParam():
                results.append(_tool_result(block, f"{where}.content[{position}]", known_ids))
            case _:
                raise _refused_block(f"{where}.content[{position}]", block.type, "a user turn")
    if texts or not results:
        results.append(PromptMessage(role="user", content="".join(texts)))
    return results


def _assistant_turn(blocks: Sequence[ContentBlockParam], where: str, known_ids: set[str]) -> PromptMessage:
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[PromptToolCall] = []
    for position, block in enumerate(blocks):
        match block:
            case TextBlockParam(text=text):
                texts.append(text)
            case ThinkingBlockParam(thinking=thinking):
                reasoning.append(thinking)
            case ToolUseBlockParam(id=call_id, name=name, input=arguments):
                calls.append(PromptToolCall(call_id=call_id, name=name, arguments=arguments))
                known_ids.add(call_id)
            case _:
                raise _refused_block(f"{where}.content[{position}]", block.type, "an assistant turn")
    return PromptMessage(
        role="assistant", content="".join(texts), reasoning_content="".join(reasoning) or None, tool_calls=tuple(calls)
    )


def _kept_thinking_turns(context: ContextManagementParam | None) -> int | None:
    """How many recent assistant turns keep their thinking (None: all), from `context_management.edits`."""
    kept: int | None = None
    for position, edit in enumerate(context.edits if context else []):
        where = f"context_management.edits[{position}]"
        if edit.type != CLEAR_THINKING_EDIT:
            raise unsupported(where, f"the context edit '{edit.type}'", f"only {CLEAR_THINKING_EDIT} is applied")
        match edit.keep:
            case "all" | ThinkingTurns(type="all"):
                kept = None
            case None:
                kept = 1  # Anthropic's default: thinking of the latest assistant turn only
            case ThinkingTurns(type="thinking_turns", value=int(value)) if value >= 0:
                kept = value
            case _:
                raise ApiError(400, f"{where}.keep must be 'all' or {{'type': 'thinking_turns', 'value': N}}")
    return kept


def _clear_thinking(history: list[PromptMessage], kept: int | None) -> list[PromptMessage]:
    if kept is None:
        return history
    result = list(history)
    seen = 0
    for position in range(len(result) - 1, -1, -1):
        message = result[position]
        if message.role == "assistant" and message.reasoning_content is not None:
            seen += 1
            if seen > kept:
                result[position] = message.model_copy(update={"reasoning_content": None})
    return result


def _system_prompt(system: str | Sequence[ContentBlockParam]) -> str:
    """The system text, without Claude Code's billing header block: it is metadata for Anthropic's billing, not an
    instruction, and it changes with every conversation, so leaving it first in the prompt would defeat the prefix
    cache for everything after it (the whole system prompt and tool definitions)."""
    if isinstance(system, str):
        return system
    texts: list[str] = []
    for position, block in enumerate(system):
        if not isinstance(block, TextBlockParam):
            raise _refused_block(f"system[{position}]", block.type, "text-only content")
        if not block.text.startswith(BILLING_HEADER_PREFIX):
            texts.append(block.text)
    return "".join(texts)


def normalise_history(request: MessagesPrompt) -> tuple[PromptMessage, ...]:
    """`system` and `messages` as the normalised history every protocol renders the same way."""
    if not request.messages:
        raise ApiError(400, "messages must contain at least one message", param="messages")
    history: list[PromptMessage] = []
    system = _system_prompt(request.system) if request.system else ""
    if system:
        history.append(PromptMessage(role="system", content=system))
    known_ids: set[str] = set()
    for position, message in enumerate(request.messages):
        where = f"messages[{position}]"
        blocks = _blocks(message.content)
        match message.role:
            case "system":
                history.append(PromptMessage(role="system", content=_text_only(message.content, f"{where}.content")))
            case "user":
                history.extend(_user_turn(blocks, where, known_ids))
            case "assistant":
                history.append(_assistant_turn(blocks, where, known_ids))
    return tuple(_clear_thinking(history, _kept_thinking_turns(request.context_management)))


def _functions(request: MessagesPrompt) -> tuple[ToolSpec, ...]:
    functions: list[ToolSpec] = []
    for position, tool in enumerate(request.tools or []):
        where = f"tools[{position}]"
        if tool.type not in CLIENT_TOOL_TYPES:
            raise unsupported(f"{where}.type", f"the server tool '{tool.type}'", "only client tools run here")
        if tool.input_schema is None:
            raise ApiError(400, f"{where}.input_schema is required", param=f"{where}.input_schema")
        if tool.defer_loading:
            raise unsupported(f"{where}.defer_loading", "deferred tool loading", "it needs server-side tool search")
        if tool.input_examples:
            raise unsupported(f"{where}.input_examples", "tool input examples")
        if any(caller != "direct" for caller in tool.allowed_callers or []):
            raise unsupported(f"{where}.allowed_callers", "calls from server-side code execution")
        functions.append(
            ToolSpec(name=tool.name, description=tool.description, parameters=tool.input_schema, strict=tool.strict)
        )
    return check_functions(functions, schema_field="input_schema")


def tool_policy(request: MessagesPrompt) -> ToolPolicy:
    """`tools` and `tool_choice` (auto / any / tool / none, `disable_parallel_tool_use`) as the engine's policy."""
    tools = _functions(request)
    match request.tool_choice:
        case None:
            return build_policy(tools, "auto")
        case ToolChoiceAuto(disable_parallel_tool_use=disable):
            return build_policy(tools, "auto", parallel_tool_calls=not disable)
        case ToolChoiceAny(disable_parallel_tool_use=disable):
            return build_policy(tools, "required", parallel_tool_calls=not disable)
        case ToolChoiceTool(name=name, disable_parallel_tool_use=disable):
            # One call of that tool when parallel use is off; otherwise calls of it only, as many as the model makes.
            mode = "named" if disable else "required"
            return build_policy(tools, mode, callable_tools=(name,), parallel_tool_calls=not disable)
        case ToolChoiceNone():
            return build_policy(tools, "none")


def _template_kwargs(request: MessagesPrompt) -> dict[str, JsonValue]:
    # Chat templates with a thinking switch (Qwen3's `enable_thinking`) honour an explicit "disabled".
    if request.thinking is not None and request.thinking.type == "disabled":
        return {"enable_thinking": False}
    return {}


def _structured_output(request: MessagesPrompt) -> StructuredOutput | None:
    output_format = request.output_config.format if request.output_config else None
    if output_format is None:
        return None
    # Anthropic's structured outputs are guaranteed, so a keyword the grammar cannot enforce is refused.
    where = "output_config.format.schema"
    return json_output(output_format.schema_, strict=True, where=where)


def _reject_unsupported(request: MessagesPrompt) -> None:
    if request.mcp_servers:
        raise unsupported("mcp_servers", "the MCP connector", "connect MCP servers to the client instead")


def prompt_params(request: MessagesPrompt, sampling: SamplingParams) -> GenerationParams:
    """Everything that determines the prompt, checked, plus `sampling`."""
    _reject_unsupported(request)
    policy = tool_policy(request)
    check_enforced_schemas(policy, schema_field="input_schema")
    return GenerationParams(
        messages=normalise_history(request),
        tool_policy=policy,
        sampling=sampling,
        chat_template_kwargs=_template_kwargs(request),
        structured_output=_structured_output(request),
    )


def sampling_params(request: MessagesRequest) -> SamplingParams:
    if request.max_tokens < 1:
        raise ApiError(400, f"max_tokens must be at least 1, got {request.max_tokens}", param="max_tokens")
    stop = tuple(request.stop_sequences or ())
    if len(stop) > MAX_STOP_SEQUENCES:
        raise ApiError(400, f"at most {MAX_STOP_SEQUENCES} stop_sequences are supported", param="stop_sequences")
    return SamplingParams(
        # The same greedy default as Chat Completions, so one prompt gives one answer whatever the protocol.
        temperature=request.temperature if request.temperature is not None else 0.0,
        top_p=request.top_p if request.top_p is not None else 1.0,
        top_k=request.top_k or 0,
        max_tokens=request.max_tokens,
        stop=stop,
    )


def to_command(request: MessagesRequest, model_id: ModelId) -> GenerateCommand:
    """Validate `request` (a 400 ApiError for anything we cannot honour) and turn it into a command."""
    if request.container is not None:
        raise unsupported("container", "code-execution containers")
    log_ignored(request, IGNORED_MESSAGES_FIELDS)
    params = prompt_params(request, sampling_params(request))
    return GenerateCommand(command_id=new_command_id(), model_id=model_id, params=params)


def count_command(request: MessagesPrompt, model_id: ModelId) -> GenerateCommand:
    """The command that renders `request`'s prompt on the model's runner and counts its tokens."""
    return count_only(prompt_params(request, SamplingParams()), model_id)
