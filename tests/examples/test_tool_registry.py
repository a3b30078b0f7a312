"""The example's registry derives schemas from signatures and turns every failure into a tool result."""

import json
import threading
from collections.abc import Callable
from typing import Annotated, Any, Literal, cast

import pytest
from pydantic import BaseModel, Field

from examples.agent_tools.registry import ToolError, ToolRegistry, tool_from_function
from examples.tool_calling_example import EXAMPLE_TOOLS, Weather, example_registry, get_time, get_weather
from tests.fixtures.fixture_specs import GET_TIME_TOOL, GET_WEATHER_TOOL


def parameters_of(function: Callable[..., object]) -> dict[str, Any]:
    return cast(dict[str, Any], tool_from_function(function).definition()["function"].get("parameters", {}))


def test_get_weather_schema_is_the_one_the_fixture_model_was_trained_on_key_for_key() -> None:
    # The chat template renders the tool as JSON text in the prompt, so key order matters to the model too.
    assert json.dumps(tool_from_function(get_weather).definition()) == json.dumps(GET_WEATHER_TOOL)


def test_get_time_schema_matches_the_fixture_tool_apart_from_the_parameter_description() -> None:
    definition = tool_from_function(get_time).definition()["function"]
    fixture = GET_TIME_TOOL["function"]
    assert isinstance(fixture, dict)
    assert definition["name"] == fixture["name"]
    assert definition.get("description") == fixture["description"]
    parameters = parameters_of(get_time)
    assert parameters["required"] == ["timezone"]
    assert parameters["properties"]["timezone"]["type"] == "string"


class Point(BaseModel):
    x: int
    y: int


def plot(
    points: Annotated[list[Point], Field(description="Where to draw")],
    style: Literal["line", "dots"] = "line",
    title: str | None = None,
) -> int:
    """Draw points.

    This second paragraph is for people, not for the model.
    """
    return len(points) if style == "line" or title else 0


def test_schema_follows_the_type_hints_defaults_and_the_first_docstring_paragraph() -> None:
    function = tool_from_function(plot).definition()["function"]
    assert function["name"] == "plot"
    assert function.get("description") == "Draw points."
    parameters = parameters_of(plot)
    assert parameters["required"] == ["points"]
    properties = parameters["properties"]
    assert list(properties) == ["points", "style", "title"]
    assert properties["points"] == {"type": "array", "description": "Where to draw", "items": {"$ref": "#/$defs/Point"}}
    assert properties["style"] == {"enum": ["line", "dots"], "type": "string", "default": "line"}
    assert parameters["$defs"]["Point"] == {
        "type": "object",
        "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
        "required": ["x", "y"],
    }
    # A property literally named "title" is a property, not the pydantic title that gets dropped.
    assert "title" in properties
    assert "title" not in json.dumps({key: value for key, value in parameters.items() if key != "properties"})


def untyped(city) -> str:  # pyright: ignore[reportMissingParameterType, reportUnknownParameterType]  # the point of the test
    """No hint."""
    return str(city)  # pyright: ignore[reportUnknownArgumentType]


def test_a_parameter_without_a_type_hint_is_refused() -> None:
    with pytest.raises(TypeError, match="needs a type hint"):
        tool_from_function(untyped)  # pyright: ignore[reportUnknownArgumentType]


def error_of(result: str) -> ToolError:
    return ToolError.model_validate_json(result)


def test_a_valid_call_returns_the_tool_result_as_json() -> None:
    run = example_registry(["get_weather"]).run("get_weather", '{"city": "Paris"}')
    assert run.ok
    assert Weather.model_validate_json(run.result) == get_weather("Paris")


def test_arguments_are_validated_and_coerced_by_the_schema() -> None:
    registry = ToolRegistry()
    registry.register(plot)
    run = registry.run("plot", '{"points": [{"x": 1, "y": "2"}], "style": "line"}')
    assert (run.ok, run.result) == (True, "1")
    run = registry.run("plot", '{"points": [{"x": 1}], "style": "bars"}')
    assert not run.ok
    error = error_of(run.result)
    assert error.error == "invalid_arguments"
    assert "points.0.y: Field required" in error.message
    assert "style: Input should be 'line' or 'dots'" in error.message


@pytest.mark.parametrize("arguments", ["", "{}", '{"city": ', "[]", '{"town": "Paris"}'])
def test_missing_or_malformed_arguments_are_an_invalid_arguments_result(arguments: str) -> None:
    run = example_registry(["get_weather"]).run("get_weather", arguments)
    assert not run.ok
    assert error_of(run.result).error == "invalid_arguments"


def test_an_unknown_tool_result_names_the_tools_that_exist() -> None:
    run = example_registry(["get_weather", "calculate"]).run("get_time", '{"timezone": "Asia/Tokyo"}')
    error = error_of(run.result)
    assert (run.ok, error.error) == (False, "unknown_tool")
    assert "get_weather, calculate" in error.message


def test_an_exception_in_the_tool_is_a_tool_failed_result() -> None:
    run = example_registry(["calculate"]).run("calculate", '{"expression": "__import__(\'os\')"}')
    error = error_of(run.result)
    assert (run.ok, error.error) == (False, "tool_failed")
    assert error.message.startswith("CalculationError: Call is not allowed")
    run = example_registry(["get_time"]).run("get_time", '{"timezone": "Mars/Olympus_Mons"}')
    assert error_of(run.result).error == "tool_failed"


def test_a_tool_that_hangs_is_a_timeout_result_and_the_caller_goes_on() -> None:
    release = threading.Event()

    def wait_forever(seconds: int) -> str:
        """Block until the test ends."""
        release.wait()
        return f"slept {seconds}"

    registry = ToolRegistry(timeout_seconds=0.2)
    registry.register(wait_forever)
    try:
        run = registry.run("wait_forever", '{"seconds": 60}')
    finally:
        release.set()
    error = error_of(run.result)
    assert (run.ok, error.error) == (False, "timeout")
    assert "0.2s" in error.message


def test_the_example_registry_offers_only_the_tools_asked_for() -> None:
    assert [tool["function"]["name"] for tool in example_registry(["calculate", "get_time"]).definitions()] == [
        "calculate",
        "get_time",
    ]
    every = [tool["function"]["name"] for tool in example_registry([f.__name__ for f in EXAMPLE_TOOLS]).definitions()]
    assert every == ["get_weather", "calculate", "get_time"]


def test_the_weather_is_the_same_for_a_city_every_time_and_plausible() -> None:
    assert get_weather("Paris") == get_weather(" paris ").model_copy(update={"city": "Paris"})
    temperatures = {get_weather(city).temperature for city in ("Paris", "Tokyo", "Oslo", "Rome", "Lima", "Cairo")}
    assert all(-5 <= temperature < 35 for temperature in temperatures)
    assert len(temperatures) > 1  # it depends on the city


def test_the_time_carries_the_zone_offset() -> None:
    assert get_time("Asia/Tokyo").time.endswith("+09:00")
    assert get_time("UTC").time.endswith("+00:00")
