"""Which grammar a task needs: a pure decision from its tool policy, structured output and the model's format."""

from exo.shared.types.api import FunctionDefinition
from exo.shared.types.tasks import StructuredOutput, ToolPolicy
from exo.tool_calls.grammar.spec import ConstraintMode, JsonAnswerSpec, ReasoningMarkers, ToolConstraintSpec
from exo.tool_calls.names import ToolFormatName

ConstraintSpec = ToolConstraintSpec | JsonAnswerSpec


def callable_functions(policy: ToolPolicy) -> tuple[FunctionDefinition, ...]:
    """The tools the model may call: all offered ones, or the subset a named choice / allowed_tools picked."""
    if policy.mode == "none":
        return ()
    if not policy.callable_tools:
        return policy.tools
    allowed = set(policy.callable_tools)
    return tuple(tool for tool in policy.tools if tool.name in allowed)


def _tool_mode(policy: ToolPolicy) -> ConstraintMode | None:
    match policy.mode:
        case "none":
            # Only where tools were offered: their calls are what the model must not write.
            return ConstraintMode.NO_CALLS if policy.tools else None
        case "required":
            return ConstraintMode.REQUIRED
        case "named":
            return ConstraintMode.NAMED
        case "auto":
            return ConstraintMode.STRICT_AUTO if any(tool.strict for tool in callable_functions(policy)) else None


def tool_spec(
    policy: ToolPolicy, tool_format: ToolFormatName, reasoning: ReasoningMarkers | None
) -> ToolConstraintSpec | None:
    """The tool-call constraint for the policy, or None for plain "auto" (constraining every auto request would
    cost every token; a second call under parallel_tool_calls=false is the parser's to drop)."""
    mode = _tool_mode(policy)
    if mode is None:
        return None
    return ToolConstraintSpec(
        tool_format=tool_format,
        tools=callable_functions(policy),
        mode=mode,
        parallel_tool_calls=policy.parallel_tool_calls and mode is not ConstraintMode.NAMED,
        reasoning=reasoning,
    )


def answer_spec(
    output: StructuredOutput, tool_format: ToolFormatName, policy: ToolPolicy, reasoning: ReasoningMarkers | None
) -> JsonAnswerSpec | None:
    """The JSON-answer constraint for the task, or None when the tool policy forces calls (and the answer format
    then has nothing to shape: OpenAI accepts the field and the reply is the calls).

    `tool_choice: "none"` or no tools: the reply is the JSON answer. "auto": the answer, or calls in its place.
    """
    if policy.mode in ("required", "named"):
        return None
    tools = callable_functions(policy)
    return JsonAnswerSpec(
        json_schema=output.json_schema,
        every_keyword_enforced=output.strict,
        reasoning=reasoning,
        tool_format=tool_format,
        tools=tools,
        tool_schemas_enforced=any(tool.strict for tool in tools),
        parallel_tool_calls=policy.parallel_tool_calls,
    )


def constraint_spec(
    policy: ToolPolicy,
    output: StructuredOutput | None,
    tool_format: ToolFormatName,
    reasoning: ReasoningMarkers | None,
) -> ConstraintSpec | None:
    """The one grammar the task needs (structured output when asked and not overridden by forced calls), if any."""
    answer = answer_spec(output, tool_format, policy, reasoning) if output is not None else None
    return answer if answer is not None else tool_spec(policy, tool_format, reasoning)
