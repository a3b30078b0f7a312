"""Which constraint a task with `response_format` gets, decided from its tool policy."""

import pytest

from exo.shared.types.api import FunctionDefinition
from exo.shared.types.tasks import StructuredOutput, ToolPolicy
from exo.worker.engines.mlx.constrained import ReasoningMarkers
from exo.worker.engines.mlx.generator.structured_output import answer_spec

OUTPUT = StructuredOutput(json_schema={"type": "object", "properties": {"a": {"type": "integer"}}}, strict=True)
LOOSE = FunctionDefinition(name="loose")
STRICT = FunctionDefinition(name="strict", strict=True)
THINKING = ReasoningMarkers(start="<think>", end="</think>")


@pytest.mark.parametrize("mode", ["required", "named"])
def test_forced_calls_leave_the_reply_to_the_tool_constraint(mode: str) -> None:
    policy = ToolPolicy.model_validate({"tools": [LOOSE.model_dump()], "callable_tools": ["loose"], "mode": mode})
    assert answer_spec(OUTPUT, "hermes", policy, None) is None


def test_tool_choice_none_makes_the_answer_the_whole_reply() -> None:
    spec = answer_spec(OUTPUT, "hermes", ToolPolicy(tools=(LOOSE,), mode="none"), THINKING)
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
    spec = answer_spec(OUTPUT, "hermes", ToolPolicy(tools=tools, mode="auto", parallel_tool_calls=False), None)
    assert spec is not None
    assert (spec.tools, spec.tool_schemas_enforced, spec.parallel_tool_calls) == (tools, enforced, False)


def test_allowed_tools_narrow_the_calls_that_may_replace_the_answer() -> None:
    policy = ToolPolicy(tools=(LOOSE, STRICT), callable_tools=("loose",), mode="auto")
    spec = answer_spec(OUTPUT, "hermes", policy, None)
    assert spec is not None
    assert spec.tools == (LOOSE,)
    assert not spec.tool_schemas_enforced
