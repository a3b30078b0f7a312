"""A repair's rewind on every decoder of the scheduler (tiny-qwen-tools fixture, real forward passes): a botched call
re-decoded alone, with speculation, and in a batch beside another request gives the same answer, and the request
beside it keeps its own."""

import json
from typing import Any, cast

import jsonschema
import pytest
from pydantic import JsonValue

from exo.shared.types.chunks import ToolCallArgumentsChunk, ToolCallChunk
from exo.shared.types.worker.decode_settings import DecodeSettings, LookupSettings
from exo.worker.engines.mlx.generator.request_context import EngineContext
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR, GET_WEATHER_TOOL, user
from tests.worker.engines.mlx.generator.scheduling import (
    Outcome,
    assert_ended,
    engine_context,
    run,
    run_alone,
    task,
    with_settings,
)

WEATHER_SCHEMA = cast(dict[str, Any], GET_WEATHER_TOOL["function"])["parameters"]


@pytest.fixture(scope="module")
def context() -> EngineContext:
    return engine_context(FIXTURE_MODELS_DIR / "tiny-qwen-tools", DecodeSettings(speculation=None))


def _body(question: str, **extra: JsonValue) -> dict[str, JsonValue]:
    return {"messages": [user(question)], "tools": [GET_WEATHER_TOOL], "auto_tool_grammar": False, **extra}


def _calls(outcome: Outcome) -> list[tuple[str, str]]:
    calls: list[tuple[str, str]] = []
    for chunk in outcome.chunks:
        if isinstance(chunk, ToolCallChunk):
            calls.append((chunk.name, ""))
        elif isinstance(chunk, ToolCallArgumentsChunk):
            calls[chunk.index] = (calls[chunk.index][0], calls[chunk.index][1] + chunk.fragment)
    return calls


@pytest.mark.parametrize("question", ["Break the tool.", "What time is it in Tokyo?"])
def test_a_failed_call_is_repaired_alike_on_every_decoder(context: EngineContext, question: str) -> None:
    alone = run_alone(context, task(_body(question)), rewinds=True)
    assert_ended(alone)
    calls = _calls(alone)
    assert [name for name, _ in calls] == ["get_weather"]
    jsonschema.validate(json.loads(calls[0][1]), WEATHER_SCHEMA)
    unrepaired = run_alone(context, task(_body(question, tool_call_repair=False)), rewinds=True)
    assert _calls(unrepaired) != calls

    speculating = with_settings(context, DecodeSettings(speculation=LookupSettings()))
    assert run_alone(speculating, task(_body(question)), rewinds=True).normalised() == alone.normalised()

    # Arriving together, the two share a batch; the repaired one rewinds there and the other is left untouched.
    beside = task(_body("What is the weather in Paris and Tokyo?"))
    beside_alone = run_alone(context, beside)
    repaired = task(_body(question))
    together = run(context, {0: [repaired, beside]}, rewinds=True)
    assert together[repaired.task_id].normalised() == alone.normalised()
    assert together[beside.task_id].normalised() == beside_alone.normalised()
