"""Which calls of an "auto" reply may need a repair, and the grammar a repair re-decodes a failed call under.

A call that fails to parse or validate where no grammar held it (the lazy "auto" grammar off, or a grammar that
could not be built) is rolled back to where it started and decoded once more under the lazy grammar. Where the
grammar did hold the call and it still failed (a schema keyword llguidance does not enforce, such as
`uniqueItems`), the same grammar would give the same call again under greedy decoding, so the re-decode also
excludes the failed arguments, where the exclusion can express them (`loop_guard.excluding`: a format whose
arguments are one JSON object, arguments without objects, arrays, long strings or backslashes).
"""

import json
from functools import lru_cache

from llguidance import LLMatcher

from exo.shared.types.api import FunctionDefinition
from exo.shared.types.tasks import ToolPolicy
from exo.tool_calls.grammar.lark import arguments_schema
from exo.tool_calls.grammar.spec import ReasoningMarkers, ToolConstraintSpec
from exo.tool_calls.loop_guard import CallKey
from exo.tool_calls.names import ToolFormatName
from exo.worker.engines.mlx.constrained.decision import blockable, callable_functions, enforceable_blocks, tool_spec


def repairable(policy: ToolPolicy, has_structured_output: bool, enabled: bool) -> bool:
    """Whether a failed call of this request may be repaired at all: plain "auto" (the forced modes always run a
    grammar), no `response_format` grammar to keep, repair not turned off."""
    return enabled and policy.mode == "auto" and bool(policy.tools) and not has_structured_output


def tools_at_risk(policy: ToolPolicy, tool_format: ToolFormatName, grammar_held: bool) -> frozenset[str]:
    """The callable tools whose failed calls a repair could fix: every one where no grammar holds the calls; under
    the grammar, those it holds only in part (a skipped keyword) where a repair could exclude the failed arguments.
    Never a tool whose schema no finite value satisfies (a grammar takes any arguments object for it)."""
    loose = set(policy.unenforceable_tools)
    tools = [tool for tool in callable_functions(policy) if tool.name not in loose]
    if not grammar_held:
        return frozenset(tool.name for tool in tools)
    if not blockable(tool_format):
        return frozenset()
    return frozenset(tool.name for tool in tools if _partly_enforced(tool))


def _partly_enforced(tool: FunctionDefinition) -> bool:
    return _has_unenforced_keywords(json.dumps(tool.parameters, sort_keys=True))


@lru_cache(maxsize=256)
def _has_unenforced_keywords(parameters_json: str) -> bool:
    """Whether llguidance skips (warns about) a keyword of this schema as the lenient grammar embeds it."""
    schema = arguments_schema(json.loads(parameters_json), every_keyword_enforced=False)
    grammar = LLMatcher.grammar_from_lark(f"start: %json {json.dumps(schema)}")
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    return not is_error and bool(messages)


def repair_spec(
    policy: ToolPolicy,
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
        if failed is None or not enforceable_blocks(policy, tool_format, (failed,)):
            return None
        blocked = (failed,)
    # The repair runs the lazy grammar whatever the request said about it (turning it off is what left the call
    # unheld).
    held = policy.model_copy(update={"auto_grammar": True})
    return tool_spec(held, tool_format, reasoning, auto_grammar=True, blocked=blocked)
