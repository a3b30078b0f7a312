"""Which grammar a task gets, decided from its tool policy, its structured output and the model's format."""

import pytest

from exo.shared.types.tasks import StructuredOutput, ToolPolicy
from exo.shared.types.tool_spec import ToolSpec
from exo.tool_calls.grammar.policy import RequestTools, answer_spec, constraint_spec, tool_spec, withdrawal_spec
from exo.tool_calls.grammar.spec import JsonAnswerSpec, ReasoningMarkers, ReplyShape, ToolConstraintSpec
from exo.tool_calls.loop_guard import CallKey
from exo.tool_calls.names import ToolFormatName

HERMES = ToolFormatName.HERMES

OUTPUT = StructuredOutput(json_schema={"type": "object", "properties": {"a": {"type": "integer"}}}, strict=True)
LOOSE = ToolSpec(name="loose")
STRICT = ToolSpec(name="strict", strict=True)
THINKING = ReasoningMarkers(start="<think>", end="</think>")


@pytest.mark.parametrize("mode", ["required", "named"])
def test_forced_calls_leave_the_reply_to_the_tool_constraint(mode: str) -> None:
    policy = ToolPolicy.model_validate({"tools": [LOOSE.model_dump()], "callable_tools": ["loose"], "mode": mode})
    assert answer_spec(OUTPUT, HERMES, RequestTools.of(policy), None) is None


def test_tool_choice_none_makes_the_answer_the_whole_reply() -> None:
    spec = answer_spec(OUTPUT, HERMES, RequestTools.of(ToolPolicy(tools=(LOOSE,), mode="none")), THINKING)
    assert spec is not None
    assert (spec.tools, spec.json_schema, spec.every_keyword_enforced, spec.reasoning) == (
        (),
        OUTPUT.json_schema,
        True,
        THINKING,
    )


@pytest.mark.parametrize(("tools", "enforced"), [((LOOSE,), False), ((LOOSE, STRICT), True)])
def test_auto_offers_the_callable_tools_with_schemas_enforced_only_when_one_is_strict(
    tools: tuple[ToolSpec, ...], enforced: bool
) -> None:
    spec = answer_spec(
        OUTPUT, HERMES, RequestTools.of(ToolPolicy(tools=tools, mode="auto", parallel_tool_calls=False)), None
    )
    assert spec is not None
    assert (spec.tools, spec.tool_schemas_enforced, spec.parallel_tool_calls) == (tools, enforced, False)


def test_allowed_tools_narrow_the_calls_that_may_replace_the_answer() -> None:
    policy = ToolPolicy(tools=(LOOSE, STRICT), callable_tools=("loose",), mode="auto")
    spec = answer_spec(OUTPUT, HERMES, RequestTools.of(policy), None)
    assert spec is not None
    assert spec.tools == (LOOSE,)
    assert not spec.tool_schemas_enforced


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("required", ReplyShape.CALLS),
        ("named", ReplyShape.CALLS),
        ("none", ReplyShape.TEXT_ONLY),
        ("auto", None),
    ],
)
def test_the_reply_shape_follows_tool_choice(mode: str, expected: ReplyShape | None) -> None:
    policy = ToolPolicy.model_validate({"tools": [LOOSE.model_dump()], "mode": mode})
    spec = tool_spec(RequestTools.of(policy), HERMES, None)
    assert (spec.shape if spec else None) is expected


def test_a_named_choice_is_one_call_to_its_single_tool() -> None:
    policy = ToolPolicy(tools=(LOOSE, STRICT), callable_tools=("strict",), mode="named", parallel_tool_calls=True)
    spec = tool_spec(RequestTools.of(policy), HERMES, None)
    assert spec is not None
    assert (spec.shape, spec.tools, spec.parallel_tool_calls) == (ReplyShape.CALLS, (STRICT,), False)


def test_after_a_withdrawal_the_reply_goes_on_without_the_tools_taken_away_or_without_calls() -> None:
    tools = RequestTools.of(ToolPolicy(tools=(LOOSE, STRICT)))
    narrowed = withdrawal_spec(tools, HERMES, None, frozenset({"strict"}))
    assert narrowed is not None
    assert (narrowed.shape, narrowed.tools) == (ReplyShape.TEXT_OR_CALLS, (LOOSE,))
    for taken_away in (frozenset[str](), frozenset({"loose", "strict"})):
        without_calls = withdrawal_spec(tools, HERMES, None, taken_away)
        assert without_calls is not None
        assert (without_calls.shape, without_calls.tools) == (ReplyShape.TEXT_ONLY, ())


def test_none_without_tools_needs_no_grammar_and_none_masks_calls_even_with_strict_tools() -> None:
    assert tool_spec(RequestTools.of(ToolPolicy(mode="none")), HERMES, None) is None
    spec = tool_spec(RequestTools.of(ToolPolicy(tools=(STRICT,), mode="none")), HERMES, None)
    assert spec is not None
    assert (spec.shape, spec.tools) == (ReplyShape.TEXT_ONLY, ())


def test_auto_is_constrained_only_when_a_callable_tool_is_strict() -> None:
    assert (
        tool_spec(RequestTools.of(ToolPolicy(tools=(LOOSE, STRICT), callable_tools=("loose",))), HERMES, None) is None
    )
    spec = tool_spec(RequestTools.of(ToolPolicy(tools=(LOOSE, STRICT))), HERMES, THINKING)
    assert spec is not None
    assert (spec.shape, spec.tools, spec.reasoning) == (ReplyShape.TEXT_OR_CALLS, (LOOSE, STRICT), THINKING)


def test_a_named_choice_is_one_call_whatever_parallel_tool_calls_says() -> None:
    policy = ToolPolicy(tools=(LOOSE, STRICT), callable_tools=("strict",), mode="named", parallel_tool_calls=True)
    spec = tool_spec(RequestTools.of(policy), HERMES, None)
    assert spec is not None
    assert (spec.tools, spec.parallel_tool_calls) == ((STRICT,), False)


def test_structured_output_wins_unless_calls_are_forced() -> None:
    assert isinstance(
        constraint_spec(RequestTools.of(ToolPolicy(tools=(LOOSE,))), OUTPUT, HERMES, None), JsonAnswerSpec
    )
    forced = ToolPolicy(tools=(LOOSE,), mode="required")
    assert isinstance(constraint_spec(RequestTools.of(forced), OUTPUT, HERMES, None), ToolConstraintSpec)
    assert constraint_spec(RequestTools.of(ToolPolicy(tools=(LOOSE,))), None, HERMES, None) is None


UNFINISHABLE = ToolSpec(
    name="chain", parameters={"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}
)


def test_the_lazy_auto_grammar_follows_the_node_unless_the_request_says() -> None:
    plain = ToolPolicy(tools=(LOOSE,))
    on = tool_spec(RequestTools.of(plain), HERMES, None, auto_grammar=True)
    assert on is not None
    assert (on.shape, on.tools) == (ReplyShape.TEXT_OR_CALLS, (LOOSE,))
    assert (
        tool_spec(RequestTools.of(plain.model_copy(update={"auto_grammar": False})), HERMES, None, auto_grammar=True)
        is None
    )
    assert (
        tool_spec(RequestTools.of(plain.model_copy(update={"auto_grammar": True})), HERMES, None, auto_grammar=False)
        is not None
    )
    # A strict tool keeps its grammar whatever the switch says: its client was promised valid arguments.
    strict = ToolPolicy(tools=(STRICT,), auto_grammar=False)
    assert tool_spec(RequestTools.of(strict), HERMES, None, auto_grammar=False) is not None


def test_an_unfinishable_non_strict_schema_is_left_to_validation_under_auto() -> None:
    policy = ToolPolicy(tools=(LOOSE, UNFINISHABLE), unenforceable_tools=("chain",))
    spec = tool_spec(RequestTools.of(policy), HERMES, None, auto_grammar=True)
    assert spec is not None
    held = {tool.name: tool.parameters for tool in spec.tools}
    assert held == {"loose": LOOSE.parameters, "chain": {"type": "object"}}


def test_structured_output_holds_auto_calls_to_their_schemas_with_the_lazy_grammar() -> None:
    policy = ToolPolicy(tools=(LOOSE,))
    assert not _answer(policy, auto_grammar=False).tool_schemas_enforced
    assert _answer(policy, auto_grammar=True).tool_schemas_enforced


def _answer(policy: ToolPolicy, *, auto_grammar: bool) -> JsonAnswerSpec:
    spec = answer_spec(OUTPUT, HERMES, RequestTools.of(policy), None, auto_grammar=auto_grammar)
    assert spec is not None
    return spec


def test_a_block_the_grammar_cannot_hold_switches_no_grammar_on() -> None:
    policy = ToolPolicy(tools=(LOOSE,))
    exact = CallKey.of("loose", {"a": 1})
    assert tool_spec(RequestTools.of(policy), HERMES, None, blocked=(exact,)) is not None
    # Arguments that are not JSON, a tool not offered, a format that writes arguments one by one: only reported.
    for call in (CallKey.of("loose", '{"a": }'), CallKey.of("other", {"a": 1})):
        assert tool_spec(RequestTools.of(policy), HERMES, None, blocked=(call,)) is None
    assert tool_spec(RequestTools.of(policy), ToolFormatName.QWEN3_CODER, None, blocked=(exact,)) is None
