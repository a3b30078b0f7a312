"""Turn normalised history into the message dicts a Hugging Face chat template expects.

Templates differ in what they accept, so the conversion adapts to the template instead of asking clients to:
tool-call arguments become objects (templates apply `tojson`), tool results get the name of the call they answer,
and templates that only take one call per assistant turn (Llama 3.1) get parallel calls as a sequence of turns.
"""

import json
from collections.abc import Sequence

from exo.shared.types.tasks import PromptMessage, PromptToolCall
from exo.shared.types.tool_spec import ToolSpec
from exo.tool_calls.format import HistoryNeeds

_OPENAI_SHAPE = HistoryNeeds()

TemplateMessage = dict[str, object]

SINGLE_CALL_TEMPLATE_MARKER = "only supports single tool-calls"


def template_supports_tools(chat_template: str | None) -> bool:
    """A template that never mentions `tools` would silently drop them: we describe tools ourselves then."""
    return chat_template is not None and "tools" in chat_template


def template_allows_parallel_calls(chat_template: str | None) -> bool:
    return chat_template is None or SINGLE_CALL_TEMPLATE_MARKER not in chat_template


def arguments_as_object(arguments: dict[str, object] | str) -> dict[str, object] | str:
    """Clients send arguments as a JSON string; templates apply `tojson` and need the object."""
    if isinstance(arguments, dict):
        return arguments
    try:
        decoded: object = json.loads(arguments) if arguments.strip() else {}
    except (json.JSONDecodeError, RecursionError):  # nested past what the parser recurses: kept as the text
        return arguments
    if isinstance(decoded, dict):
        return {str(key): value for key, value in decoded.items()}  # pyright: ignore[reportUnknownVariableType]
    return arguments


def _tool_call_dict(call: PromptToolCall) -> TemplateMessage:
    return {
        "id": call.call_id,
        "type": "function",
        "function": {"name": call.name, "arguments": arguments_as_object(call.arguments)},
    }


def _message_dict(message: PromptMessage, call_names: dict[str, str], history: HistoryNeeds) -> TemplateMessage:
    result: TemplateMessage = {"role": message.role, "content": message.content}
    if message.tool_calls:
        result["tool_calls"] = [_tool_call_dict(call) for call in message.tool_calls]
    if message.role == "tool":
        result["tool_call_id"] = message.tool_call_id or ""
        name = message.name or call_names.get(message.tool_call_id or "")
        if name is not None:
            result["name"] = name
    if message.reasoning_content:
        result[history.reasoning_field] = message.reasoning_content
    return result


def _sequence_parallel_calls(messages: Sequence[PromptMessage]) -> list[PromptMessage]:
    """Rewrite `assistant(c1, c2), tool(r1), tool(r2)` as `assistant(c1), tool(r1), assistant(c2), tool(r2)`."""
    result: list[PromptMessage] = []
    index = 0
    while index < len(messages):
        message = messages[index]
        index += 1
        if message.role != "assistant" or len(message.tool_calls) <= 1:
            result.append(message)
            continue
        results: dict[str, PromptMessage] = {}
        unmatched: list[PromptMessage] = []
        while index < len(messages) and messages[index].role == "tool":
            tool_message = messages[index]
            if tool_message.tool_call_id is not None:
                results[tool_message.tool_call_id] = tool_message
            else:
                unmatched.append(tool_message)
            index += 1
        for position, call in enumerate(message.tool_calls):
            content = message.content if position == 0 else ""
            result.append(message.model_copy(update={"tool_calls": (call,), "content": content}))
            answer = results.pop(call.call_id, None) or (unmatched.pop(0) if unmatched else None)
            if answer is not None:
                result.append(answer)
        result.extend(results.values())
        result.extend(unmatched)
    return result


def tool_description(tool: ToolSpec) -> dict[str, object]:
    """What the model is shown of a tool: `strict` is a server-side control, so the prompt is the same with or
    without it (and the same whichever API protocol the tool came through)."""
    return tool.model_dump(exclude_none=True, exclude={"strict"})


def describe_tools_prompt(tools: Sequence[ToolSpec]) -> str:
    """System text for templates without tool support: describe the tools and ask for `<tool_call>` JSON."""
    lines = [
        "You can call the following tools. To call one, reply with",
        '<tool_call>{"name": <tool name>, "arguments": <JSON object>}</tool_call>',
        "(one block per call) and nothing else. Available tools:",
    ]
    lines.extend(json.dumps(tool_description(tool)) for tool in tools)
    return "\n".join(lines)


def _inline_tool_history(messages: Sequence[PromptMessage]) -> list[PromptMessage]:
    """For templates that know nothing of tools: calls and results become plain text turns."""
    result: list[PromptMessage] = []
    for message in messages:
        if message.role == "assistant" and message.tool_calls:
            blocks = "".join(
                "<tool_call>"
                + json.dumps({"name": call.name, "arguments": arguments_as_object(call.arguments)})
                + "</tool_call>"
                for call in message.tool_calls
            )
            result.append(PromptMessage(role="assistant", content=message.content + blocks))
        elif message.role == "tool":
            result.append(PromptMessage(role="user", content=f"<tool_response>{message.content}</tool_response>"))
        else:
            result.append(message)
    return result


def to_template_messages(
    messages: Sequence[PromptMessage],
    *,
    chat_template: str | None,
    tools: Sequence[ToolSpec],
    needs: HistoryNeeds = _OPENAI_SHAPE,
) -> list[TemplateMessage]:
    """Convert history for `chat_template`; when the template lacks tool support, tools go into a system turn.

    `needs` are the model's tool format's own (GPT-OSS's template reads earlier reasoning from `thinking`).
    """
    history = list(messages)
    if not template_supports_tools(chat_template):
        history = _inline_tool_history(history)
        if tools:
            history = _prepend_system(history, describe_tools_prompt(tools))
    elif not template_allows_parallel_calls(chat_template):
        history = _sequence_parallel_calls(history)
    call_names = {call.call_id: call.name for message in history for call in message.tool_calls}
    return [_message_dict(message, call_names, needs) for message in history]


def _prepend_system(history: list[PromptMessage], text: str) -> list[PromptMessage]:
    if history and history[0].role == "system":
        first = history[0]
        return [first.model_copy(update={"content": f"{first.content}\n\n{text}"}), *history[1:]]
    return [PromptMessage(role="system", content=text), *history]
