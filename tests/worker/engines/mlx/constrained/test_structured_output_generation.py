"""Real sampling (temperature 1.0, random-weight models) under `response_format`: every reply is JSON that validates."""

import json
from collections.abc import Sequence

import jsonschema
import mlx.core as mx
import pytest
from pydantic import JsonValue

from exo.tool_calls.grammar.spec import JsonAnswerSpec, ReasoningMarkers
from exo.tool_calls.names import ToolFormatName
from exo.worker.engines.mlx.constrained import make_logits_processor
from exo.worker.engines.mlx.constrained.compiled import compiled_template, guidance_tokenizer
from tests.worker.engines.mlx.constrained.conftest import LoadedModel
from tests.worker.engines.mlx.constrained.generation import (
    PROMPT,
    Generation,
    LogitsProcessor,
    assert_valid_call,
    generate,
    marker_steering_processor,
    parse_llama3_call,
    prompt_length,
    split_strict_auto,
    steering_processor,
)
from tests.worker.engines.mlx.constrained.schemas import SEARCH, WEATHER

SEEDS = range(8)
_OPENER_PENALTY = 6.0
JsonSchema = dict[str, JsonValue]

PERSON: JsonSchema = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "role": {"type": "string", "enum": ["admin", "user", "guest"]},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}
SCHEMAS: dict[str, JsonSchema] = {
    "flat_required_closed": PERSON,
    "nested_objects": {
        "type": "object",
        "properties": {
            "owner": PERSON,
            "address": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 10}, "zip": {"type": "integer"}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
        "required": ["owner", "address"],
        "additionalProperties": False,
    },
    "array_of_enums_and_booleans": {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"enum": ["red", "green", 3, None]}, "minItems": 1, "maxItems": 4},
            "flags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
            "score": {"type": "number"},
        },
        "required": ["tags", "flags", "score"],
        "additionalProperties": False,
    },
    "defs_and_any_of": {
        "$defs": {
            "point": {
                "type": "object",
                "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                "required": ["x", "y"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {
            "shape": {
                "anyOf": [
                    {"$ref": "#/$defs/point"},
                    {"type": "array", "items": {"$ref": "#/$defs/point"}, "maxItems": 2},
                ]
            },
            "label": {"type": ["string", "null"], "maxLength": 8},
        },
        "required": ["shape", "label"],
        "additionalProperties": False,
    },
    "top_level_array": {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "maxItems": 5},
}


def _answer(
    tool_model: LoadedModel,
    spec: JsonAnswerSpec,
    seed: int,
    *,
    steer_to: str | None = None,
    max_tokens: int = 400,
    extra: Sequence[LogitsProcessor] = (),
) -> Generation:
    model, tokenizer = tool_model
    processor = make_logits_processor(tokenizer, spec, prompt_length=prompt_length(tokenizer))
    steering = [steering_processor(tokenizer), *extra]
    if steer_to is not None:
        steering.append(marker_steering_processor(tokenizer, steer_to, once=True))
    return generate(model, tokenizer, [*steering, processor], seed=seed, max_tokens=max_tokens)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_reply_is_json_valid_against_the_schema(tool_model: LoadedModel, name: str) -> None:
    schema = SCHEMAS[name]
    for seed in SEEDS:
        generation = _answer(tool_model, JsonAnswerSpec(json_schema=schema, every_keyword_enforced=True), seed)
        assert generation.ended_with_eos, f"seed {seed}: the grammar never let the reply end: {generation.text!r}"
        jsonschema.validate(json.loads(generation.text), schema)


def _flat_steering(tool_model: LoadedModel) -> LogitsProcessor:
    """Stands in for a model that writes flat objects: a random one nests `{`/`[` until max_tokens.

    It runs before the constraint, so it only shifts preferences among tokens the grammar then filters.
    """
    _, tokenizer = tool_model
    openers = [token for token in range(tokenizer.vocab_size) if set("{[") & set(tokenizer.decode([token]))]

    def damp(tokens: mx.array, logits: mx.array) -> mx.array:
        del tokens
        bias = mx.zeros((logits.shape[-1],), dtype=logits.dtype)
        bias[mx.array(openers)] = -_OPENER_PENALTY
        return logits + bias

    return damp


def test_json_object_mode_always_yields_an_object(tool_model: LoadedModel) -> None:
    for seed in SEEDS:
        generation = _answer(
            tool_model, JsonAnswerSpec(json_schema={"type": "object"}), seed, extra=[_flat_steering(tool_model)]
        )
        assert generation.ended_with_eos, generation.text
        assert isinstance(json.loads(generation.text), dict), generation.text


def test_the_reply_ends_as_soon_as_the_value_is_complete(tool_model: LoadedModel) -> None:
    """Only end-of-turn may follow a complete answer: the grammar ends the reply, not the sampler's luck."""
    _, tokenizer = tool_model
    prompt: list[int] = tokenizer.encode(PROMPT)
    answer: list[int] = tokenizer.encode('{"name": "Ada", "age": 36, "role": "admin"}')
    processor = make_logits_processor(tokenizer, JsonAnswerSpec(json_schema=PERSON), prompt_length=len(prompt))
    logits = mx.zeros((1, tokenizer.vocab_size + 7))
    for end in range(len(answer)):
        processor(mx.array(prompt + answer[:end]), logits)
    masked = processor(mx.array(prompt + answer), logits)
    allowed = {index for index in range(masked.shape[-1]) if masked[0, index].item() == 0.0}
    assert allowed == set(tokenizer.eos_token_ids)


def test_a_reply_cut_by_max_tokens_is_a_prefix_of_valid_json(tool_model: LoadedModel) -> None:
    generation = _answer(tool_model, JsonAnswerSpec(json_schema=PERSON), seed=1, max_tokens=6)
    assert not generation.ended_with_eos
    assert generation.text.startswith('{"name": "'), generation.text


def test_auto_tools_yield_either_valid_calls_or_the_valid_answer(tool_model: LoadedModel) -> None:
    tools = (WEATHER, SEARCH)
    spec = JsonAnswerSpec(
        json_schema=PERSON, tool_format=ToolFormatName.HERMES, tools=tools, tool_schemas_enforced=True
    )
    answers = replies_with_calls = 0
    for seed in range(12):
        generation = _answer(tool_model, spec, seed, steer_to="<tool_call>" if seed % 2 == 0 else "{")
        assert generation.ended_with_eos, generation.text
        prose, calls = split_strict_auto(generation.text)
        if calls:
            assert prose == "", f"text before the calls: {generation.text!r}"
            for call in calls:
                assert_valid_call(call, tools)
            replies_with_calls += 1
        else:
            jsonschema.validate(json.loads(generation.text), PERSON)
            answers += 1
    # Both branches were exercised (the steering picks the opening; the grammar finishes either).
    assert answers > 0
    assert replies_with_calls > 0


def test_calls_to_non_strict_tools_keep_the_name_but_any_object_arguments(tool_model: LoadedModel) -> None:
    only_city = WEATHER.model_copy(
        update={"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    )
    spec = JsonAnswerSpec(
        json_schema=PERSON, tool_format=ToolFormatName.HERMES, tools=(only_city,), parallel_tool_calls=False
    )
    for seed in SEEDS:
        _, calls = split_strict_auto(
            _answer(tool_model, spec, seed, steer_to="<tool_call>", extra=[_flat_steering(tool_model)]).text
        )
        assert [call.name for call in calls] == ["get_weather"]
        assert isinstance(calls[0].arguments, dict)


def test_llama3_auto_replies_are_json_either_a_call_or_the_answer(tool_model: LoadedModel) -> None:
    spec = JsonAnswerSpec(
        json_schema=PERSON, tool_format=ToolFormatName.LLAMA3_JSON, tools=(SEARCH,), tool_schemas_enforced=True
    )
    for seed in SEEDS:
        generation = _answer(tool_model, spec, seed)
        assert generation.ended_with_eos, generation.text
        text = generation.text.removeprefix("<|python_tag|>")
        payload = json.loads(text)
        if isinstance(payload, dict) and set(payload) == {"name", "parameters"}:
            assert_valid_call(parse_llama3_call(text), (SEARCH,))
        else:
            jsonschema.validate(payload, PERSON)


def test_reasoning_stays_free_and_the_answer_follows_it(tool_model: LoadedModel) -> None:
    thinking = ReasoningMarkers(start="<think>", end="</think>", opened_in_prompt=True)
    spec = JsonAnswerSpec(json_schema=PERSON, reasoning=thinking)
    for seed in SEEDS:
        generation = _answer(tool_model, spec, seed, steer_to="</think>")
        assert generation.ended_with_eos, generation.text
        _, separator, reply = generation.text.partition("</think>")
        assert separator, generation.text
        jsonschema.validate(json.loads(reply), PERSON)


def test_a_cached_grammar_starts_fresh_for_each_request(tool_model: LoadedModel) -> None:
    guidance_tokenizer.cache_clear()  # cold: no cached tokenizer or grammar
    compiled_template.cache_clear()
    spec = JsonAnswerSpec(json_schema=SCHEMAS["nested_objects"])
    first = _answer(tool_model, spec, seed=3)
    second = _answer(tool_model, spec, seed=3)
    assert second.tokens == first.tokens
    jsonschema.validate(json.loads(second.text), SCHEMAS["nested_objects"])
