"""What a request asks us to enforce on tool calls: a pure decision from `tools` / `tool_choice`."""

from enum import StrEnum

from exo.shared.types.api import AllowedToolsChoice, FunctionDefinition, NamedToolChoice, ToolChoice, ToolDefinition
from exo.shared.types.common import FrozenModel


class UnsupportedConstraintError(ValueError):
    """The request asks for enforcement this module cannot give (unknown format, schema llguidance rejects)."""


class ConstraintMode(StrEnum):
    """Which tool-call constraint the grammar enforces."""

    REQUIRED = "required"
    """One or more calls (exactly one without parallel calls) to the given tools, nothing else."""
    NAMED = "named"
    """Exactly one call to the single given tool."""
    STRICT_AUTO = "strict_auto"
    """Free text, but a call once opened must name a given tool and match its schema."""


class ReasoningMarkers(FrozenModel):
    """A reasoning block the model may write before its reply (Qwen3 `<think>…</think>`); its text is free."""

    start: str
    end: str
    opened_in_prompt: bool = False
    """True when the chat template already wrote `start` at the end of the prompt: the reply begins inside it."""


class ToolConstraintSpec(FrozenModel):
    """Everything the grammar depends on; built by the runner from the request and the model's tool format."""

    tool_format: str
    """The model's tool-call format (the parser package's format names): "hermes", "generic", "llama3_json"…"""
    tools: tuple[FunctionDefinition, ...]
    """The tools that may be called, already narrowed by a named choice or `allowed_tools`."""
    mode: ConstraintMode
    parallel_tool_calls: bool
    reasoning: ReasoningMarkers | None = None
    """Set for reasoning models, so the constraint leaves room to think before the calls."""


def constraint_needed(
    tools: list[ToolDefinition] | None, tool_choice: ToolChoice | None, parallel_tool_calls: bool | None
) -> ConstraintMode | None:
    """Decide whether generation must be constrained, and how.

    None means the plain path: no tools, `tool_choice: "none"`, or `"auto"` without any `strict` tool.
    `parallel_tool_calls` does not change the mode (it narrows the grammar of a constrained request); under plain
    "auto" a second call is the parser's to drop, since constraining every auto request would cost every token.
    """
    del parallel_tool_calls  # part of the decision's inputs by contract; it shapes the grammar, not the mode
    if not tools:
        return None
    match tool_choice:
        case "none":
            return None
        case "required":
            return ConstraintMode.REQUIRED
        case NamedToolChoice():
            return ConstraintMode.NAMED
        case AllowedToolsChoice(allowed_tools=allowed) if allowed.mode == "required":
            return ConstraintMode.REQUIRED
        case AllowedToolsChoice() | "auto" | None:
            offered = select_constrained_tools(tools, tool_choice)
            return ConstraintMode.STRICT_AUTO if any(tool.strict for tool in offered) else None


def select_constrained_tools(
    tools: list[ToolDefinition], tool_choice: ToolChoice | None
) -> tuple[FunctionDefinition, ...]:
    """The functions a constrained reply may call: the named one, the `allowed_tools` subset, or all of them.

    Raises UnsupportedConstraintError when the choice names a function that is not among `tools`, so a request
    can never be constrained to an empty set (which would leave the model no legal output).
    """
    functions = tuple(tool.function for tool in tools if tool.type == "function")
    match tool_choice:
        case NamedToolChoice(function=named):
            chosen = tuple(function for function in functions if function.name == named.name)
            if not chosen:
                raise UnsupportedConstraintError(f"tool_choice names {named.name!r}, which is not among the tools")
            return chosen
        case AllowedToolsChoice(allowed_tools=allowed):
            names = {_allowed_tool_name(entry) for entry in allowed.tools}
            chosen = tuple(function for function in functions if function.name in names)
            if not chosen:
                raise UnsupportedConstraintError("allowed_tools names none of the request's tools")
            return chosen
        case _:
            return functions


def _allowed_tool_name(entry: dict[str, object]) -> str | None:
    """`allowed_tools` entries come as chat-style `{"function": {"name"}}` or responses-style `{"name"}`."""
    function = entry.get("function")
    if isinstance(function, dict):
        name: object = function.get("name")  # pyright: ignore[reportUnknownMemberType] -- untyped JSON
        return name if isinstance(name, str) else None
    name = entry.get("name")
    return name if isinstance(name, str) else None
