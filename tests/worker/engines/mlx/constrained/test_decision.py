"""Which grammar a task gets, decided from its tool policy, its structured output and the model's format."""

import pytest

from exo.shared.types.api import FunctionDefinition
from exo.shared.types.tasks import StructuredOutput, ToolPolicy
from exo.tool_calls.grammar.spec import ConstraintMode, JsonAnswerSpec, ReasoningMarkers, ToolConstraintSpec
from exo.tool_calls.loop_guard import CallKey
from exo.tool_calls.names import ToolFormatName
from exo.worker.engines.mlx.constrained.decision import answer_spec, constraint_spec, tool_spec

HERMES = ToolFormatName.HERMES

OUTPUT = StructuredOutput(json_schema={"type": "object", "properties": {"a": {"type": "integer"}}}, strict=True)
LOOSE = FunctionDefinition(name="loose")
STRICT = FunctionDefinition(name="strict", strict=True)
THINKING = ReasoningMarkers(start="<think>", end="</think>")


@pytest.mark.parametrize("mode", ["required", "named"])
def test_forced_calls_leave_the_reply_to_the_tool_constraint(mode: str) -> None:
    policy = ToolPolicy.model_validate({"tools": [LOOSE.model_dump()], "callable_tools": ["loose"], "mode": mode})
    assert answer_spec(OUTPUT, HERMES, policy, None) is None


def test_tool_choice_none_makes_the_answer_the_whole_reply() -> None:
    spec = answer_spec(OUTPUT, HERMES, ToolPolicy(tools=(LOOSE,), mode="none"), THINKING)
    assert spec is not None
    assert (spec.tools, spec.json_schema, spec.every_keyword_enforced, spec.reasoning) == (
        (),
        OUTPUT.json_schema,
        True,
        THINKING,
    )


@pytest.mark.parametrize(("tools", "enforced"), [((LOOSE,), False), ((LOOSE, STRICT), True)])
def test_auto_offers_the_callable_tools_with_schemas_enforced_only_when_one_is_strict(
    tools: tuple[FunctionDefinition, ...], enforced: bool
) -> None:
    spec = answer_spec(OUTPUT, HERMES, ToolPolicy(tools=tools, mode="auto", parallel_tool_calls=False), None)
    assert spec is not None
    assert (spec.tools, spec.tool_schemas_enforced, spec.parallel_tool_calls) == (tools, enforced, False)


def test_allowed_tools_narrow_the_calls_that_may_replace_the_answer() -> None:
    policy = ToolPolicy(tools=(LOOSE, STRICT), callable_tools=("loose",), mode="auto")
    spec = answer_spec(OUTPUT, HERMES, policy, None)
    assert spec is not None
    assert spec.tools == (LOOSE,)
    assert not spec.tool_schemas_enforced


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("required", ConstraintMode.REQUIRED),
        ("named", ConstraintMode.NAMED),
        ("none", ConstraintMode.NO_CALLS),
        ("auto", None),
    ],
)
def test_the_tool_mode_follows_tool_choice(mode: str, expected: ConstraintMode | None) -> None:
    policy = ToolPolicy.model_validate({"tools": [LOOSE.model_dump()], "mode": mode})
    spec = tool_spec(policy, HERMES, None)
    assert (spec.mode if spec else None) is expected


def test_none_without_tools_needs_no_grammar_and_none_masks_calls_even_with_strict_tools() -> None:
    assert tool_spec(ToolPolicy(mode="none"), HERMES, None) is None
    spec = tool_spec(ToolPolicy(tools=(STRICT,), mode="none"), HERMES, None)
    assert spec is not None
    assert (spec.mode, spec.tools) == (ConstraintMode.NO_CALLS, ())


def test_auto_is_constrained_only_when_a_callable_tool_is_strict() -> None:
    assert tool_spec(ToolPolicy(tools=(LOOSE, STRICT), callable_tools=("loose",)), HERMES, None) is None
    spec = tool_spec(ToolPolicy(tools=(LOOSE, STRICT)), HERMES, THINKING)
    assert spec is not None
    assert (spec.mode, spec.tools, spec.reasoning) == (ConstraintMode.AUTO, (LOOSE, STRICT), THINKING)


def test_a_named_choice_is_one_call_whatever_parallel_tool_calls_says() -> None:
    policy = ToolPolicy(tools=(LOOSE, STRICT), callable_tools=("strict",), mode="named", parallel_tool_calls=True)
    spec = tool_spec(policy, HERMES, None)
    assert spec is not None
    assert (spec.tools, spec.parallel_tool_calls) == ((STRICT,), False)


def test_structured_output_wins_unless_calls_are_forced() -> None:
    assert isinstance(constraint_spec(ToolPolicy(tools=(LOOSE,)), OUTPUT, HERMES, None), JsonAnswerSpec)
    forced = ToolPolicy(tools=(LOOSE,), mode="required")
    assert isinstance(constraint_spec(forced, OUTPUT, HERMES, None), ToolConstraintSpec)
    assert constraint_spec(ToolPolicy(tools=(LOOSE,)), None, HERMES, None) is None


UNFINISHABLE = FunctionDefinition(
    name="chain", parameters={"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}
)


def test_the_lazy_auto_grammar_follows_the_node_unless_the_request_says() -> None:
    plain = ToolPolicy(tools=(LOOSE,))
    on = tool_spec(plain, HERMES, None, auto_grammar=True)
    assert on is not None
    assert (on.mode, on.tools) == (ConstraintMode.AUTO, (LOOSE,))
    assert tool_spec(plain.model_copy(update={"auto_grammar": False}), HERMES, None, auto_grammar=True) is None
    assert tool_spec(plain.model_copy(update={"auto_grammar": True}), HERMES, None, auto_grammar=False) is not None
    # A strict tool keeps its grammar whatever the switch says: its client was promised valid arguments.
    strict = ToolPolicy(tools=(STRICT,), auto_grammar=False)
    assert tool_spec(strict, HERMES, None, auto_grammar=False) is not None


def test_an_unfinishable_non_strict_schema_is_left_to_validation_under_auto() -> None:
    policy = ToolPolicy(tools=(LOOSE, UNFINISHABLE), unenforceable_tools=("chain",))
    spec = tool_spec(policy, HERMES, None, auto_grammar=True)
    assert spec is not None
    held = {tool.name: tool.parameters for tool in spec.tools}
    assert held == {"loose": LOOSE.parameters, "chain": {"type": "object"}}


def test_structured_output_holds_auto_calls_to_their_schemas_with_the_lazy_grammar() -> None:
    policy = ToolPolicy(tools=(LOOSE,))
    assert not _answer(policy, auto_grammar=False).tool_schemas_enforced
    assert _answer(policy, auto_grammar=True).tool_schemas_enforced


def _answer(policy: ToolPolicy, *, auto_grammar: bool) -> JsonAnswerSpec:
    spec = answer_spec(OUTPUT, HERMES, policy, None, auto_grammar=auto_grammar)
    assert spec is not None
    return spec


def test_a_block_the_grammar_cannot_hold_switches_no_grammar_on() -> None:
    policy = ToolPolicy(tools=(LOOSE,))
    exact = CallKey.of("loose", {"a": 1})
    assert tool_spec(policy, HERMES, None, blocked=(exact,)) is not None
    # Arguments that are not JSON, a tool not offered, a format that writes arguments one by one: only reported.
    for call in (CallKey.of("loose", '{"a": }'), CallKey.of("other", {"a": 1})):
        assert tool_spec(policy, HERMES, None, blocked=(call,)) is None
    assert tool_spec(policy, ToolFormatName.QWEN3_CODER, None, blocked=(exact,)) is None
