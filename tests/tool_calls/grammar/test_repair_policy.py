"""Which calls a repair may re-decode, and under which grammar (tool_calls/grammar/policy.py)."""

from exo.shared.types.tasks import ToolPolicy
from exo.shared.types.tool_spec import ToolSpec
from exo.tool_calls.grammar.policy import RequestTools, repair_spec, repairable, tools_at_risk
from exo.tool_calls.grammar.spec import ReplyShape
from exo.tool_calls.loop_guard import CallKey
from exo.tool_calls.names import ToolFormatName

HERMES = ToolFormatName.HERMES
CITY = ToolSpec(
    name="city", parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
)
NOT_PARIS = ToolSpec(
    name="not_paris",
    parameters={"type": "object", "properties": {"city": {"type": "string", "not": {"const": "Paris"}}}},
)
UNIQUE_TAGS = ToolSpec(
    name="tags",
    parameters={"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}},
)
POLICY = ToolPolicy(tools=(CITY, NOT_PARIS, UNIQUE_TAGS))


def test_only_plain_auto_without_a_response_format_is_repaired() -> None:
    assert repairable(RequestTools.of(POLICY), has_structured_output=False, enabled=True)
    assert not repairable(RequestTools.of(POLICY), has_structured_output=False, enabled=False)
    assert not repairable(RequestTools.of(POLICY), has_structured_output=True, enabled=True)
    assert not repairable(
        RequestTools.of(POLICY.model_copy(update={"mode": "required"})), has_structured_output=False, enabled=True
    )


def test_without_a_grammar_every_tool_is_at_risk_but_one_no_grammar_could_finish() -> None:
    assert tools_at_risk(RequestTools.of(POLICY), HERMES, grammar_held=False) == {"city", "not_paris", "tags"}
    unfinishable = POLICY.model_copy(update={"unenforceable_tools": ("tags",)})
    assert tools_at_risk(RequestTools.of(unfinishable), HERMES, grammar_held=False) == {"city", "not_paris"}


def test_under_the_grammar_only_tools_with_a_skipped_keyword_in_a_whole_json_format_are_at_risk() -> None:
    assert tools_at_risk(RequestTools.of(POLICY), HERMES, grammar_held=True) == {"not_paris", "tags"}
    # Formats writing arguments one by one cannot exclude the failed arguments: nothing a repair could do better.
    assert tools_at_risk(RequestTools.of(POLICY), ToolFormatName.QWEN3_CODER, grammar_held=True) == frozenset()


def test_the_repair_grammar_is_the_lazy_one_even_where_the_request_turned_it_off() -> None:
    unheld = POLICY.model_copy(update={"auto_grammar": False})
    spec = repair_spec(RequestTools.of(unheld), HERMES, None, grammar_held=False, failed=None)
    assert spec is not None
    assert spec.shape is ReplyShape.TEXT_OR_CALLS
    assert [tool.parameters for tool in spec.tools] == [tool.parameters for tool in POLICY.tools]


def test_under_the_grammar_the_failed_arguments_are_excluded_or_there_is_no_repair() -> None:
    paris = CallKey.of("not_paris", {"city": "Paris"})
    spec = repair_spec(RequestTools.of(POLICY), HERMES, None, grammar_held=True, failed=paris)
    assert spec is not None
    narrowed = next(tool for tool in spec.tools if tool.name == "not_paris")
    assert "allOf" in narrowed.parameters
    # A failed array (uniqueItems) is excluded item by item like any other value.
    tags = CallKey.of("tags", {"tags": ["a", "a"]})
    spec = repair_spec(RequestTools.of(POLICY), HERMES, None, grammar_held=True, failed=tags)
    assert spec is not None
    assert "allOf" in next(tool for tool in spec.tools if tool.name == "tags").parameters
    # Arguments the exclusion cannot express (a string past its limit), or a call rejected before its name: the same
    # grammar would write the same call again, so no repair.
    long_tags = CallKey.of("tags", {"tags": ["a" * 200, "a" * 200]})
    assert repair_spec(RequestTools.of(POLICY), HERMES, None, grammar_held=True, failed=long_tags) is None
    assert repair_spec(RequestTools.of(POLICY), HERMES, None, grammar_held=True, failed=None) is None
