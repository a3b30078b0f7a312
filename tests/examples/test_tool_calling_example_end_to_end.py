"""The example's agent loop against a real exo node serving the tiny tool-calling fixture model.

The fixture model (tests/fixtures/fixture_specs.py) calls get_weather for its trained prompts and answers in text
only after the exact tool result it was trained on, so the single-call tests register a get_weather that returns
that result; the other tests use the example's own tools.
"""

import io
import json
from collections.abc import Iterator
from typing import Annotated

import pytest
from openai import OpenAI
from pydantic import Field

from examples.agent_tools.registry import ToolError, ToolRegistry
from examples.tool_calling_example import Weather, example_registry, main, run_agent
from examples.tool_calling_example import get_weather as example_get_weather
from tests.exo_server import ExoServer, fixture_model, running_exo
from tests.fixtures.fixture_specs import PARIS_WEATHER_ANSWER, PARIS_WEATHER_RESULT

MODEL = "tiny-qwen-tools"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    # The example's own guards are what these tests exercise: its error path needs a call that no grammar held and
    # no repair re-decoded (the fixture's broken `{"city": }`), so this node runs with the lazy "auto" grammar, the
    # repair and the server's loop guard off (blocking the answered `{}` call would switch a grammar on); the trained
    # calls are valid either way.
    models, directory = [fixture_model(MODEL)], tmp_path_factory.mktemp("exo-example")
    flags = ["--no-auto-tool-grammar", "--no-tool-call-repair", "--loop-guard", "off"]
    with running_exo(models, directory, flags) as running:
        yield running


@pytest.fixture
def client(server: ExoServer) -> OpenAI:
    return server.openai_client()


def trained_weather_registry(cities: list[str]) -> ToolRegistry:
    """A registry whose get_weather answers what the fixture model was trained on, and records each city."""

    def get_weather(city: Annotated[str, Field(description="City name")]) -> Weather:
        """Get the current weather for a city."""
        cities.append(city)
        return Weather.model_validate_json(PARIS_WEATHER_RESULT)

    registry = ToolRegistry()
    registry.register(get_weather)
    return registry


@pytest.mark.parametrize("stream", [True, False])
def test_the_model_calls_the_tool_the_loop_runs_it_and_the_answer_comes_back(client: OpenAI, stream: bool) -> None:
    cities: list[str] = []
    output = io.StringIO()
    result = run_agent(
        client, MODEL, "What is the weather in Paris?", trained_weather_registry(cities), stream=stream, output=output
    )
    assert cities == ["Paris"]
    assert [(run.name, json.loads(run.arguments), run.ok) for run in result.tool_runs] == [
        ("get_weather", {"city": "Paris"}, True)
    ]
    assert json.loads(result.tool_runs[0].result) == json.loads(PARIS_WEATHER_RESULT)
    assert result.answer == PARIS_WEATHER_ANSWER
    printed = output.getvalue()
    assert "→ get_weather(" in printed
    assert printed.rstrip().endswith(PARIS_WEATHER_ANSWER)


def test_parallel_calls_are_assembled_by_index_and_each_runs_the_example_tool(client: OpenAI) -> None:
    result = run_agent(
        client,
        MODEL,
        "What is the weather in Paris and Tokyo?",
        example_registry(["get_weather"]),
        max_turns=1,
        output=io.StringIO(),
    )
    runs = result.tool_runs
    assert [(run.name, json.loads(run.arguments)) for run in runs] == [
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "Tokyo"}),
    ]
    assert [Weather.model_validate_json(run.result) for run in runs] == [
        example_get_weather("Paris"),
        example_get_weather("Tokyo"),
    ]
    assert result.answer is None  # one turn allowed, spent on the calls


def test_a_call_with_broken_arguments_goes_back_to_the_model_as_an_error(client: OpenAI) -> None:
    # The fixture model answers this prompt with `{"city": }`: exo keeps a call once its name is known, so the
    # broken arguments reach the registry, whose validation error becomes the next message the model reads.
    result = run_agent(
        client, MODEL, "Break the tool.", example_registry(["get_weather"]), max_turns=2, output=io.StringIO()
    )
    first = result.tool_runs[0]
    assert (first.name, first.ok) == ("get_weather", False)
    error = ToolError.model_validate_json(first.result)
    assert error.error == "invalid_arguments"
    assert "Invalid JSON" in error.message
    assert 'received \'{"city": }' in error.message
    # The history with the broken call was accepted and the model took a second turn (it answers in text).
    assert result.answer is not None
    assert len(result.tool_runs) == 1


def test_the_command_line_runs_the_loop_with_the_chosen_tools(
    server: ExoServer, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["--base-url", f"{server.base_url}/v1", "--tools", "get_weather", "--max-turns", "1"])
    printed = capsys.readouterr().out
    assert "→ get_weather(" in printed
    assert f"← {json.dumps(example_get_weather('Paris').model_dump())}" in printed
    assert status == 1  # the only turn went to the tool call, so there is no answer yet
