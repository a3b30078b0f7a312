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
from exo.tool_calls.loop_guard import CallKey, excluding
from exo.tool_calls.names import ToolFormatName

ConstraintSpec = ToolConstraintSpec | JsonAnswerSpec

# Formats whose calls hold their arguments as one JSON object checked against the whole schema: the only ones where
# the exclusion of a failed call's arguments (a schema with allOf/anyOf, constrained/repair.py) reaches the grammar.
# Formats that write arguments one by one read only the schema's top-level properties, so there a repair cannot
# exclude them.
_WHOLE_JSON_ARGUMENTS = frozenset(
    {
        ToolFormatName.HERMES,
        ToolFormatName.GENERIC,
        ToolFormatName.LLAMA3_JSON,
        ToolFormatName.MISTRAL,
        ToolFormatName.HARMONY,
        ToolFormatName.DEEPSEEK_V31,
        ToolFormatName.KIMI_K2,
    }
)


def blockable(tool_format: ToolFormatName) -> bool:
    """Whether `block` can keep the model from re-issuing a call in this format (see `_WHOLE_JSON_ARGUMENTS`)."""
    return tool_format in _WHOLE_JSON_ARGUMENTS


def enforceable_blocks(
    policy: ToolPolicy, tool_format: ToolFormatName, blocked: tuple[CallKey, ...]
) -> tuple[CallKey, ...]:
    """The blocked calls the grammar can actually forbid: in a blockable format, to a callable tool, with arguments
    `excluding` can rule out (the others cannot be excluded, and must not switch a grammar on for nothing)."""
    if not blockable(tool_format):
        return ()
    tools = {tool.name: tool for tool in callable_functions(policy)}
    return tuple(
        call for call in blocked if call.name in tools and excluding(tools[call.name].parameters, (call,)) is not None
    )


def callable_functions(policy: ToolPolicy) -> tuple[FunctionDefinition, ...]:
    """The tools the model may call: all offered ones, or the subset a named choice / allowed_tools picked."""
    if policy.mode == "none":
        return ()
    if not policy.callable_tools:
        return policy.tools
    allowed = set(policy.callable_tools)
    return tuple(tool for tool in policy.tools if tool.name in allowed)


def _tool_mode(policy: ToolPolicy, auto_grammar: bool, blocking: bool) -> ConstraintMode | None:
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
            held = strict or blocking or auto_grammar_on(policy, auto_grammar)
            return ConstraintMode.AUTO if held else None


def auto_grammar_on(policy: ToolPolicy, node_default: bool) -> bool:
    """Whether plain "auto" runs the lazy grammar: the request's own choice, else the node's."""
    return node_default if policy.auto_grammar is None else policy.auto_grammar


def _held_tools(
    policy: ToolPolicy, mode: ConstraintMode, blocked: tuple[CallKey, ...]
) -> tuple[FunctionDefinition, ...]:
    """The callable tools as the grammar holds them: under "auto", a non-strict tool whose schema cannot be
    finished takes any arguments object (validated afterwards, as without a grammar); a tool with blocked calls
    takes every arguments object but theirs."""
    loose = set(policy.unenforceable_tools) if mode is ConstraintMode.AUTO else set[str]()
    held: list[FunctionDefinition] = []
    for tool in callable_functions(policy):
        parameters = ANY_ARGUMENTS if tool.name in loose and not tool.strict else tool.parameters
        calls = tuple(call for call in blocked if call.name == tool.name)
        narrowed = excluding(parameters, calls) if calls else None
        final = narrowed if narrowed is not None else parameters
        held.append(tool if final is tool.parameters else tool.model_copy(update={"parameters": final}))
    return tuple(held)


def tool_spec(
    policy: ToolPolicy,
    tool_format: ToolFormatName,
    reasoning: ReasoningMarkers | None,
    *,
    auto_grammar: bool = False,
    blocked: tuple[CallKey, ...] = (),
) -> ToolConstraintSpec | None:
    """The tool-call constraint for the policy, or None for "auto" with the lazy grammar off, no strict tool and
    nothing to block (`auto_grammar` is the node's setting; the request's `policy.auto_grammar` overrides it;
    `blocked` are the calls a repair excludes, honoured where the format allows, see `enforceable_blocks`)."""
    blocked = enforceable_blocks(policy, tool_format, blocked)
    mode = _tool_mode(policy, auto_grammar, bool(blocked))
    if mode is None:
        return None
    return ToolConstraintSpec(
        tool_format=tool_format,
        tools=_held_tools(policy, mode, blocked),
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
    blocked: tuple[CallKey, ...] = (),
) -> JsonAnswerSpec | None:
    """The JSON-answer constraint for the task, or None when the tool policy forces calls (and the answer format
    then has nothing to shape: OpenAI accepts the field and the reply is the calls).

    `tool_choice: "none"` or no tools: the reply is the JSON answer. "auto": the answer, or calls in its place.
    """
    if policy.mode in ("required", "named"):
        return None
    blocked = enforceable_blocks(policy, tool_format, blocked)
    tools = _held_tools(policy, ConstraintMode.AUTO, blocked)
    held = any(tool.strict for tool in tools) or bool(blocked) or auto_grammar_on(policy, auto_grammar)
    return JsonAnswerSpec(
        json_schema=output.json_schema,
        every_keyword_enforced=output.strict,
        reasoning=reasoning,
        tool_format=tool_format,
        tools=tools,
        tool_schemas_enforced=held,
        parallel_tool_calls=policy.parallel_tool_calls,
    )


def constraint_spec(
    policy: ToolPolicy,
    output: StructuredOutput | None,
    tool_format: ToolFormatName,
    reasoning: ReasoningMarkers | None,
    *,
    auto_grammar: bool = False,
    blocked: tuple[CallKey, ...] = (),
) -> ConstraintSpec | None:
    """The one grammar the task needs (structured output when asked and not overridden by forced calls), if any."""
    answer = (
        answer_spec(output, tool_format, policy, reasoning, auto_grammar=auto_grammar, blocked=blocked)
        if output is not None
        else None
    )
    if answer is not None:
        return answer
    return tool_spec(policy, tool_format, reasoning, auto_grammar=auto_grammar, blocked=blocked)
