"""Grammar fast-forward: the tokens a grammar forces are fed as a draft and verified in one forward pass. Greedy
output must be token for token what step-by-step constrained decoding writes, over drawn schemas (enums, integers,
nested objects, arrays) in the tiny-qwen-tools fixture's format — and it must take fewer forward passes."""

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exo.shared.types.worker.decode_settings import DecodeSettings, LookupSettings
from exo.worker.engines.mlx.generator.chat_completion import ChatRequest
from exo.worker.engines.mlx.generator.request_context import EngineContext
from exo.worker.engines.mlx.generator.scheduler import GenerationScheduler
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR, user
from tests.worker.engines.mlx.generator.scheduling import (
    MAX_STEPS,
    Outcome,
    assert_ended,
    engine_context,
    task,
    with_settings,
)

FAST_FORWARD = DecodeSettings(speculation=LookupSettings(adaptive=False), grammar_fast_forward=True)
LOOKUP_ONLY = DecodeSettings(speculation=LookupSettings(adaptive=False), grammar_fast_forward=False)
STEP_BY_STEP = DecodeSettings(speculation=None)

_NAMES = st.sampled_from(["city", "days", "unit", "tags", "options", "path", "count", "mode"])
_LEAVES: st.SearchStrategy[dict[str, Any]] = st.one_of(
    st.just({"type": "string"}),
    st.lists(
        st.sampled_from(["celsius", "fahrenheit", "kelvin", "read", "write"]), min_size=1, max_size=3, unique=True
    ).map(lambda values: {"type": "string", "enum": values}),
    st.tuples(st.integers(0, 5), st.integers(6, 90)).map(
        lambda bounds: {"type": "integer", "minimum": bounds[0], "maximum": bounds[1]}
    ),
    st.just({"type": "boolean"}),
    st.just({"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "maxItems": 3}),
)


def _object(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(_NAMES, children, min_size=1, max_size=4).map(
        lambda properties: {
            "type": "object",
            "properties": properties,
            "required": sorted(properties),
            "additionalProperties": False,
        }
    )


SCHEMAS = _object(st.one_of(_LEAVES, _object(_LEAVES)))


@pytest.fixture(scope="module")
def context() -> EngineContext:
    return engine_context(FIXTURE_MODELS_DIR / "tiny-qwen-tools", STEP_BY_STEP)


def _decode(context: EngineContext, schema: dict[str, Any], settings_: DecodeSettings) -> tuple[Outcome, int]:
    """The chunks of one required call under `schema`, and how many forward passes produced them."""
    tool = {"type": "function", "function": {"name": "configure", "parameters": schema}}
    body: dict[str, Any] = {
        "messages": [user("What is the weather in Paris?")],
        "tools": [tool],
        "tool_choice": "required",
        "max_tokens": 160,
    }
    scheduler = GenerationScheduler(context.loaded.model, settings_)
    scheduler.admit(ChatRequest.open(with_settings(context, settings_), task(body)))
    outcome = Outcome([])
    for step in range(MAX_STEPS):
        for update in scheduler.step():
            outcome.chunks += update.chunks
        if scheduler.active == 0:
            return outcome, step + 1
    raise AssertionError("still running")


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=SCHEMAS)
def test_fast_forward_writes_what_step_by_step_decoding_writes(context: EngineContext, schema: dict[str, Any]) -> None:
    plain, _ = _decode(context, schema, STEP_BY_STEP)
    forwarded, _ = _decode(context, schema, FAST_FORWARD)
    assert_ended(plain)
    assert forwarded.normalised() == plain.normalised(), json.dumps(schema)


def test_fast_forward_takes_fewer_forward_passes_on_a_call_with_many_fixed_keys(context: EngineContext) -> None:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "unit": {"type": "string", "enum": ["celsius"]},
            "options": {
                "type": "object",
                "properties": {"mode": {"type": "string", "enum": ["read"]}, "count": {"type": "boolean"}},
                "required": ["mode", "count"],
                "additionalProperties": False,
            },
            "tags": {"type": "string", "enum": ["kelvin"]},
        },
        "required": ["unit", "options", "tags"],
        "additionalProperties": False,
    }
    plain, plain_passes = _decode(context, schema, STEP_BY_STEP)
    looked_up, lookup_passes = _decode(context, schema, LOOKUP_ONLY)
    forwarded, forwarded_passes = _decode(context, schema, FAST_FORWARD)
    assert forwarded.normalised() == looked_up.normalised() == plain.normalised()
    # The saving is the grammar's, not prompt lookup's: lookup drafts alone save far less here.
    assert forwarded_passes < plain_passes / 2, (forwarded_passes, plain_passes)
    assert forwarded_passes < lookup_passes, (forwarded_passes, lookup_passes)
