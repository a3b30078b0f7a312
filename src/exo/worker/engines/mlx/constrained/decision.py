"""Which grammar a task needs: a pure decision from its tool policy, structured output and the model's format."""

from exo.shared.types.api import FunctionDefinition
from exo.shared.types.tasks import StructuredOutput, ToolPolicy
from exo.tool_calls.grammar.spec import (
    ANY_ARGUMENTS,
    ConstraintMode,
    JsonAnswerSpec,
    ReasoningMarkers,
    ToolConstraintSpec,
)
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


def _tool_mode(policy: ToolPolicy, auto_grammar: bool) -> ConstraintMode | None:
    match policy.mode:
        case "none":
            # Only where tools were offered: their calls are what the model must not write.
            return ConstraintMode.NO_CALLS if policy.tools else None
        case "required":
            return ConstraintMode.REQUIRED
        case "named":
            return ConstraintMode.NAMED
        case "auto":
            strict = any(tool.strict for tool in callable_functions(policy))
            return ConstraintMode.AUTO if strict or auto_grammar_on(policy, auto_grammar) else None


def auto_grammar_on(policy: ToolPolicy, node_default: bool) -> bool:
    """Whether plain "auto" runs the lazy grammar: the request's own choice, else the node's."""
    return node_default if policy.auto_grammar is None else policy.auto_grammar


def _held_tools(policy: ToolPolicy, mode: ConstraintMode) -> tuple[FunctionDefinition, ...]:
    """The callable tools as the grammar holds them: under "auto", a non-strict tool whose schema cannot be
    finished takes any arguments object (validated afterwards, as without a grammar)."""
    tools = callable_functions(policy)
    if mode is not ConstraintMode.AUTO or not policy.unenforceable_tools:
        return tools
    loose = set(policy.unenforceable_tools)
    return tuple(
        tool.model_copy(update={"parameters": ANY_ARGUMENTS}) if tool.name in loose and not tool.strict else tool
        for tool in tools
    )


def tool_spec(
    policy: ToolPolicy, tool_format: ToolFormatName, reasoning: ReasoningMarkers | None, *, auto_grammar: bool = False
) -> ToolConstraintSpec | None:
    """The tool-call constraint for the policy, or None for "auto" with the lazy grammar off and no strict tool
    (`auto_grammar` is the node's setting; the request's `policy.auto_grammar` overrides it)."""
    mode = _tool_mode(policy, auto_grammar)
    if mode is None:
        return None
    return ToolConstraintSpec(
        tool_format=tool_format,
        tools=_held_tools(policy, mode),
        mode=mode,
        parallel_tool_calls=policy.parallel_tool_calls and mode is not ConstraintMode.NAMED,
        reasoning=reasoning,
    )


def answer_spec(
    output: StructuredOutput,
    tool_format: ToolFormatName,
    policy: ToolPolicy,
    reasoning: ReasoningMarkers | None,
    *,
    auto_grammar: bool = False,
) -> JsonAnswerSpec | None:
    """The JSON-answer constraint for the task, or None when the tool policy forces calls (and the answer format
    then has nothing to shape: OpenAI accepts the field and the reply is the calls).

    `tool_choice: "none"` or no tools: the reply is the JSON answer. "auto": the answer, or calls in its place.
    """
    if policy.mode in ("required", "named"):
        return None
    tools = _held_tools(policy, ConstraintMode.AUTO)
    return JsonAnswerSpec(
        json_schema=output.json_schema,
        every_keyword_enforced=output.strict,
        reasoning=reasoning,
        tool_format=tool_format,
        tools=tools,
        tool_schemas_enforced=any(tool.strict for tool in tools) or auto_grammar_on(policy, auto_grammar),
        parallel_tool_calls=policy.parallel_tool_calls,
    )


def constraint_spec(
    policy: ToolPolicy,
    output: StructuredOutput | None,
    tool_format: ToolFormatName,
    reasoning: ReasoningMarkers | None,
    *,
    auto_grammar: bool = False,
) -> ConstraintSpec | None:
    """The one grammar the task needs (structured output when asked and not overridden by forced calls), if any."""
    answer = answer_spec(output, tool_format, policy, reasoning, auto_grammar=auto_grammar) if output else None
    return answer if answer is not None else tool_spec(policy, tool_format, reasoning, auto_grammar=auto_grammar)
