"""Every grammar decision of a request: pure functions of its tool policy, its structured output and the model's
format.

Which grammar a task needs (`constraint_spec`: calls only for `tool_choice: "required"` or a named function, checked
calls for `strict` tools or the lazy grammar under "auto", text that never opens a call for "none", a JSON answer for
`response_format`); which failed calls a repair may re-decode and under which grammar; which grammar a reply goes on
under once the loop guard withdrew a call. The engine compiles what these return (worker/engines/mlx/constrained).

Repairs: a call that fails to parse or validate where no grammar held it (the lazy "auto" grammar off, or a grammar
that could not be built) is rolled back to where it started and decoded once more under the lazy grammar. Where the
grammar did hold the call and it still failed (a schema keyword llguidance does not enforce, such as `uniqueItems`),
the same grammar would give the same call again under greedy decoding, so the re-decode also excludes the failed
arguments, where the exclusion can express them (grammar/exclusion.py).
"""

import json
from dataclasses import dataclass, replace
from functools import lru_cache

from llguidance import LLMatcher

from exo.shared.types.tasks import StructuredOutput, ToolPolicy
from exo.shared.types.tool_spec import ToolSpec
from exo.tool_calls.grammar.exclusion import excluding
from exo.tool_calls.grammar.lark import arguments_schema
from exo.tool_calls.grammar.spec import (
    ANY_ARGUMENTS,
    JsonAnswerSpec,
    ReasoningMarkers,
    ReplyShape,
    ToolConstraintSpec,
)
from exo.tool_calls.loop_guard import CallKey
from exo.tool_calls.names import ToolFormatName

ConstraintSpec = ToolConstraintSpec | JsonAnswerSpec


def callable_functions(policy: ToolPolicy) -> tuple[ToolSpec, ...]:
    """The tools the model may call: all offered ones, or the subset a named choice / allowed_tools picked."""
    if policy.mode == "none":
        return ()
    if not policy.callable_tools:
        return policy.tools
    allowed = set(policy.callable_tools)
    return tuple(tool for tool in policy.tools if tool.name in allowed)


@dataclass(frozen=True)
class RequestTools:
    """A request's tool policy with the tools it lets the model call, worked out once per request (`of`) and
    carried to every decision that reads them."""

    policy: ToolPolicy
    callable_functions: tuple[ToolSpec, ...]

    @classmethod
    def of(cls, policy: ToolPolicy) -> "RequestTools":
        return cls(policy=policy, callable_functions=callable_functions(policy))

    @property
    def any_strict(self) -> bool:
        """Whether a callable tool asked for `strict` (its calls are then always held to its schema)."""
        return any(tool.strict for tool in self.callable_functions)


# Formats whose calls hold their arguments as one JSON object checked against the whole schema: the only ones where
# the exclusion of a failed call's arguments (a schema with allOf/anyOf, grammar/exclusion.py) reaches the grammar.
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
    """Whether a grammar can keep the model from re-issuing a call in this format (see `_WHOLE_JSON_ARGUMENTS`)."""
    return tool_format in _WHOLE_JSON_ARGUMENTS


def enforceable_blocks(
    tools: RequestTools, tool_format: ToolFormatName, blocked: tuple[CallKey, ...]
) -> tuple[CallKey, ...]:
    """The blocked calls the grammar can actually forbid: in a blockable format, to a callable tool, with arguments
    `excluding` can rule out (the others cannot be excluded, and must not switch a grammar on for nothing)."""
    if not blockable(tool_format):
        return ()
    by_name = {tool.name: tool for tool in tools.callable_functions}
    return tuple(
        call
        for call in blocked
        if call.name in by_name and excluding(by_name[call.name].parameters, (call,)) is not None
    )


def _tool_shape(tools: RequestTools, auto_grammar: bool, blocking: bool) -> ReplyShape | None:
    """The reply's shape under the request's `tool_choice` (None: no grammar)."""
    policy = tools.policy
    match policy.mode:
        case "none":
            # Only where tools were offered: their calls are what the model must not write.
            return ReplyShape.TEXT_ONLY if policy.tools else None
        case "required" | "named":
            return ReplyShape.CALLS
        case "auto":
            held = tools.any_strict or blocking or auto_grammar_on(policy, auto_grammar)
            return ReplyShape.TEXT_OR_CALLS if held else None


def auto_grammar_on(policy: ToolPolicy, node_default: bool) -> bool:
    """Whether plain "auto" runs the lazy grammar: the request's own choice, else the node's."""
    return node_default if policy.auto_grammar is None else policy.auto_grammar


def _held_tools(tools: RequestTools, *, under_auto: bool, blocked: tuple[CallKey, ...]) -> tuple[ToolSpec, ...]:
    """The callable tools as the grammar holds them: under "auto", a non-strict tool whose schema cannot be
    finished takes any arguments object (validated afterwards, as without a grammar); a tool with blocked calls
    takes every arguments object but theirs."""
    loose = set(tools.policy.unenforceable_tools) if under_auto else set[str]()
    held: list[ToolSpec] = []
    for tool in tools.callable_functions:
        parameters = ANY_ARGUMENTS if tool.name in loose and not tool.strict else tool.parameters
        calls = tuple(call for call in blocked if call.name == tool.name)
        narrowed = excluding(parameters, calls) if calls else None
        final = narrowed if narrowed is not None else parameters
        held.append(tool if final is tool.parameters else tool.model_copy(update={"parameters": final}))
    return tuple(held)


def tool_spec(
    tools: RequestTools,
    tool_format: ToolFormatName,
    reasoning: ReasoningMarkers | None,
    *,
    auto_grammar: bool = False,
    blocked: tuple[CallKey, ...] = (),
) -> ToolConstraintSpec | None:
    """The tool-call constraint for the policy, or None for "auto" with the lazy grammar off, no strict tool and
    nothing to block (`auto_grammar` is the node's setting; the request's `policy.auto_grammar` overrides it;
    `blocked` are the calls a repair excludes, honoured where the format allows, see `enforceable_blocks`).
    A named tool_choice is one call: calls to its single tool, never parallel."""
    blocked = enforceable_blocks(tools, tool_format, blocked)
    shape = _tool_shape(tools, auto_grammar, bool(blocked))
    if shape is None:
        return None
    policy = tools.policy
    return ToolConstraintSpec(
        tool_format=tool_format,
        tools=_held_tools(tools, under_auto=shape is ReplyShape.TEXT_OR_CALLS, blocked=blocked),
        shape=shape,
        parallel_tool_calls=policy.parallel_tool_calls and policy.mode != "named",
        reasoning=reasoning,
    )


def answer_spec(
    output: StructuredOutput,
    tool_format: ToolFormatName,
    tools: RequestTools,
    reasoning: ReasoningMarkers | None,
    *,
    auto_grammar: bool = False,
    blocked: tuple[CallKey, ...] = (),
) -> JsonAnswerSpec | None:
    """The JSON-answer constraint for the task, or None when the tool policy forces calls (and the answer format
    then has nothing to shape: OpenAI accepts the field and the reply is the calls).

    `tool_choice: "none"` or no tools: the reply is the JSON answer. "auto": the answer, or calls in its place.
    """
    policy = tools.policy
    if policy.mode in ("required", "named"):
        return None
    blocked = enforceable_blocks(tools, tool_format, blocked)
    held_tools = _held_tools(tools, under_auto=True, blocked=blocked)
    held = any(tool.strict for tool in held_tools) or bool(blocked) or auto_grammar_on(policy, auto_grammar)
    return JsonAnswerSpec(
        json_schema=output.json_schema,
        every_keyword_enforced=output.strict,
        reasoning=reasoning,
        tool_format=tool_format,
        tools=held_tools,
        tool_schemas_enforced=held,
        parallel_tool_calls=policy.parallel_tool_calls,
    )


def constraint_spec(
    tools: RequestTools,
    output: StructuredOutput | None,
    tool_format: ToolFormatName,
    reasoning: ReasoningMarkers | None,
    *,
    auto_grammar: bool = False,
    blocked: tuple[CallKey, ...] = (),
) -> ConstraintSpec | None:
    """The one grammar the task needs (structured output when asked and not overridden by forced calls), if any."""
    answer = (
        answer_spec(output, tool_format, tools, reasoning, auto_grammar=auto_grammar, blocked=blocked)
        if output is not None
        else None
    )
    if answer is not None:
        return answer
    return tool_spec(tools, tool_format, reasoning, auto_grammar=auto_grammar, blocked=blocked)


def grammar_optional(spec: ConstraintSpec | None, tools: RequestTools) -> bool:
    """Whether a grammar that cannot be built may be left out (the calls are then parsed and validated as without
    it): the lazy "auto" grammar, where no strict tool asked for it. Any other grammar is a condition of the reply."""
    lazy = isinstance(spec, ToolConstraintSpec) and spec.shape is ReplyShape.TEXT_OR_CALLS
    return lazy and not tools.any_strict


def withdrawal_spec(
    tools: RequestTools, tool_format: ToolFormatName, reasoning: ReasoningMarkers | None, taken_away: frozenset[str]
) -> ToolConstraintSpec | None:
    """The grammar a reply goes on under after the loop guard withdrew a call: the lazy grammar of the tools left
    once `taken_away` are (`block`: the model may call another tool or answer), or that of `tool_choice: "none"`
    (text that never opens a call) where none is left or nothing is taken away (`answer`: every tool goes)."""
    left = tuple(tool for tool in tools.callable_functions if tool.name not in taken_away)
    if taken_away and left:
        narrowed = tools.policy.model_copy(update={"callable_tools": tuple(tool.name for tool in left)})
        return tool_spec(RequestTools(narrowed, left), tool_format, reasoning, auto_grammar=True)
    return tool_spec(RequestTools.of(tools.policy.model_copy(update={"mode": "none"})), tool_format, reasoning)


def repair_on(policy: ToolPolicy, node_default: bool) -> bool:
    """Whether the request lets a failed call be repaired: its own choice, else the node's."""
    return node_default if policy.repair is None else policy.repair


def repairable(tools: RequestTools, has_structured_output: bool, enabled: bool) -> bool:
    """Whether a failed call of this request may be repaired at all: plain "auto" (the forced modes always run a
    grammar), no `response_format` grammar to keep, repair not turned off."""
    policy = tools.policy
    return enabled and policy.mode == "auto" and bool(policy.tools) and not has_structured_output


def tools_at_risk(tools: RequestTools, tool_format: ToolFormatName, grammar_held: bool) -> frozenset[str]:
    """The callable tools whose failed calls a repair could fix: every one where no grammar holds the calls; under
    the grammar, those it holds only in part (a skipped keyword) where a repair could exclude the failed arguments.
    Never a tool whose schema no finite value satisfies (a grammar takes any arguments object for it)."""
    loose = set(tools.policy.unenforceable_tools)
    repairable_tools = [tool for tool in tools.callable_functions if tool.name not in loose]
    if not grammar_held:
        return frozenset(tool.name for tool in repairable_tools)
    if not blockable(tool_format):
        return frozenset()
    return frozenset(tool.name for tool in repairable_tools if _partly_enforced(tool))


def _partly_enforced(tool: ToolSpec) -> bool:
    return _has_unenforced_keywords(json.dumps(tool.parameters, sort_keys=True))


@lru_cache(maxsize=256)
def _has_unenforced_keywords(parameters_json: str) -> bool:
    """Whether llguidance skips (warns about) a keyword of this schema as the lenient grammar embeds it."""
    schema = arguments_schema(json.loads(parameters_json), every_keyword_enforced=False)
    grammar = LLMatcher.grammar_from_lark(f"start: %json {json.dumps(schema)}")
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    return not is_error and bool(messages)


def repair_spec(
    tools: RequestTools,
    tool_format: ToolFormatName,
    reasoning: ReasoningMarkers | None,
    *,
    grammar_held: bool,
    failed: CallKey | None,
) -> ToolConstraintSpec | None:
    """The lazy grammar a failed call is re-decoded under, or None where a re-decode could not do better: under a
    grammar that already held the call, unless its failed arguments can be excluded."""
    blocked: tuple[CallKey, ...] = ()
    if grammar_held:
        if failed is None or not enforceable_blocks(tools, tool_format, (failed,)):
            return None
        blocked = (failed,)
    # The repair runs the lazy grammar whatever the request said about it (turning it off is what left the call
    # unheld).
    held = replace(tools, policy=tools.policy.model_copy(update={"auto_grammar": True}))
    return tool_spec(held, tool_format, reasoning, auto_grammar=True, blocked=blocked)
