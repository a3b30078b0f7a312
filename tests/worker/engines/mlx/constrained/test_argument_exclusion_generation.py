"""A grammar that excludes one call's exact arguments (what the repair of a failed call re-decodes under) under real
sampling: random-weight models pushed to write, piece by piece, that very call. Without the exclusion they write
it; with it the grammar cannot, yet the same push towards the same tool with new arguments still gets through."""

import json
from typing import cast

from pydantic import JsonValue

from exo.shared.types.tasks import ToolPolicy
from exo.tool_calls.grammar.policy import RequestTools, tool_spec
from exo.tool_calls.loop_guard import CallKey
from exo.tool_calls.names import ToolFormatName
from exo.worker.engines.mlx.constrained import make_logits_processor
from tests.worker.engines.mlx.constrained.conftest import LoadedModel
from tests.worker.engines.mlx.constrained.generation import (
    ParsedCall,
    assert_valid_call,
    generate,
    marker_steering_processor,
    prompt_length,
    split_strict_auto,
    steering_processor,
)
from tests.worker.engines.mlx.constrained.schemas import SEARCH, WEATHER

SEEDS = range(12)
PARIS: dict[str, JsonValue] = {"city": "Paris", "unit": "celsius"}
PARIS_IN_FAHRENHEIT: dict[str, JsonValue] = {"city": "Paris", "unit": "fahrenheit"}
TOOLS = (WEATHER, SEARCH)


def _excluded(arguments: dict[str, JsonValue]) -> CallKey:
    return CallKey.of("get_weather", cast(dict[str, object], arguments))


def _call_text(arguments: dict[str, JsonValue]) -> str:
    return f"<tool_call>\n{json.dumps({'name': 'get_weather', 'arguments': arguments})}\n</tool_call>"


def _calls(tool_model: LoadedModel, excluded: CallKey, block: bool, pushed: dict[str, JsonValue]) -> list[ParsedCall]:
    """Every call written over the seeds when the model is pushed towards `pushed` (each one checked valid)."""
    model, tokenizer = tool_model
    blocked = (excluded,) if block else ()
    spec = tool_spec(
        RequestTools.of(ToolPolicy(tools=TOOLS)), ToolFormatName.HERMES, None, auto_grammar=True, blocked=blocked
    )
    assert spec is not None
    written: list[ParsedCall] = []
    for seed in SEEDS:
        grammar = make_logits_processor(tokenizer, spec, prompt_length=prompt_length(tokenizer))
        steering = [steering_processor(tokenizer), marker_steering_processor(tokenizer, _call_text(pushed), once=True)]
        # Under the exclusion the push towards the forbidden call never stops, so calls may follow calls to the limit.
        generation = generate(model, tokenizer, [*steering, grammar], seed=seed)
        _, calls = split_strict_auto(generation.text, ended=generation.ended_with_eos)
        for call in calls:
            assert_valid_call(call, TOOLS)
        written += calls
    return written


def test_the_exclusion_keeps_the_model_from_writing_the_excluded_call(tool_model: LoadedModel) -> None:
    history = _excluded(PARIS)
    repeat = ParsedCall(name="get_weather", arguments=PARIS)
    # The push reproduces the loop when nothing blocks it...
    assert repeat in _calls(tool_model, history, block=False, pushed=PARIS)
    # ...and under the exclusion the identical call is never written.
    assert repeat not in _calls(tool_model, history, block=True, pushed=PARIS)


def test_the_exclusion_lets_the_same_tool_through_with_new_arguments(tool_model: LoadedModel) -> None:
    blocked = _calls(tool_model, _excluded(PARIS), block=True, pushed=PARIS_IN_FAHRENHEIT)
    assert ParsedCall(name="get_weather", arguments=PARIS_IN_FAHRENHEIT) in blocked
    # Away from the excluded call nothing changes: the same seeds write the same calls without the exclusion.
    assert blocked == _calls(tool_model, _excluded(PARIS), block=False, pushed=PARIS_IN_FAHRENHEIT)
