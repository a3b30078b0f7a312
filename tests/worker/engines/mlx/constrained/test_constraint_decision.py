"""Which requests get constrained, and to which tools."""

import pytest

from exo.shared.types.api import (
    AllowedToolsChoice,
    AllowedToolsSpec,
    FunctionDefinition,
    NamedFunction,
    NamedToolChoice,
    ToolChoice,
    ToolDefinition,
)
from exo.worker.engines.mlx.constrained import (
    ConstraintMode,
    UnsupportedConstraintError,
    constraint_needed,
    select_constrained_tools,
)
from tests.worker.engines.mlx.constrained.schemas import SEARCH, WEATHER

TOOLS = [ToolDefinition(function=WEATHER), ToolDefinition(function=SEARCH.model_copy(update={"strict": None}))]
STRICT_TOOLS = [ToolDefinition(function=WEATHER), ToolDefinition(function=SEARCH)]


def _allowed(mode: str, *names: str) -> AllowedToolsChoice:
    entries: list[dict[str, object]] = [{"type": "function", "function": {"name": name}} for name in names]
    return AllowedToolsChoice.model_validate(
        {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": entries}}
    )


@pytest.mark.parametrize(
    ("tool_choice", "expected"),
    [
        ("required", ConstraintMode.REQUIRED),
        (NamedToolChoice(function=NamedFunction(name="search")), ConstraintMode.NAMED),
        (_allowed("required", "search"), ConstraintMode.REQUIRED),
        ("auto", None),
        (None, None),
        ("none", None),
        (_allowed("auto", "search"), None),
    ],
)
def test_mode_follows_tool_choice(tool_choice: ToolChoice | None, expected: ConstraintMode | None) -> None:
    assert constraint_needed(TOOLS, tool_choice, parallel_tool_calls=None) is expected


def test_no_tools_means_no_constraint_even_when_required() -> None:
    assert constraint_needed(None, "required", parallel_tool_calls=False) is None
    assert constraint_needed([], "required", parallel_tool_calls=False) is None


@pytest.mark.parametrize("tool_choice", ["auto", None, _allowed("auto", "search", "get_weather")])
def test_auto_with_a_strict_tool_constrains_calls(tool_choice: ToolChoice | None) -> None:
    assert constraint_needed(STRICT_TOOLS, tool_choice, parallel_tool_calls=True) is ConstraintMode.STRICT_AUTO


def test_strict_tool_outside_allowed_tools_does_not_constrain() -> None:
    assert constraint_needed(STRICT_TOOLS, _allowed("auto", "get_weather"), parallel_tool_calls=True) is None


def test_none_wins_over_strict_tools() -> None:
    assert constraint_needed(STRICT_TOOLS, "none", parallel_tool_calls=True) is None


def test_named_choice_selects_only_that_function() -> None:
    chosen = select_constrained_tools(TOOLS, NamedToolChoice(function=NamedFunction(name="get_weather")))
    assert [function.name for function in chosen] == ["get_weather"]


def test_allowed_tools_selects_the_subset_in_either_entry_shape() -> None:
    choice = AllowedToolsChoice(
        type="allowed_tools",
        allowed_tools=AllowedToolsSpec(mode="required", tools=[{"type": "function", "name": "search"}]),
    )
    assert [function.name for function in select_constrained_tools(TOOLS, choice)] == ["search"]
    assert [function.name for function in select_constrained_tools(TOOLS, _allowed("auto", "search"))] == ["search"]


def test_required_selects_every_function() -> None:
    assert select_constrained_tools(TOOLS, "required") == (WEATHER, TOOLS[1].function)


def test_naming_an_unknown_function_is_an_error_not_an_empty_constraint() -> None:
    with pytest.raises(UnsupportedConstraintError, match="nope"):
        select_constrained_tools(TOOLS, NamedToolChoice(function=NamedFunction(name="nope")))
    with pytest.raises(UnsupportedConstraintError):
        select_constrained_tools(TOOLS, _allowed("required", "nope"))


def test_non_function_tools_are_never_selected() -> None:
    tools = [*TOOLS, ToolDefinition(type="custom", function=FunctionDefinition(name="other"))]
    assert "other" not in [function.name for function in select_constrained_tools(tools, "required")]
