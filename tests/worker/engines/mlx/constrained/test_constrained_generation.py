"""Real sampling (temperature 1.0, random-weight models) under the constraint: every reply obeys tool_choice."""

import logging
import time
from concurrent.futures import ThreadPoolExecutor

import mlx.core as mx
import pytest

from exo.api.types.openai_chat import FunctionDefinition, ToolDefinition
from exo.shared.types.tool_spec import ToolSpec
from exo.tool_calls.grammar.spec import ReasoningMarkers, ReplyShape, ToolConstraintSpec
from exo.tool_calls.names import ToolFormatName
from exo.worker.engines.mlx.constrained import make_logits_processor
from exo.worker.engines.mlx.constrained.compiled import compiled_template, guidance_tokenizer
from tests.worker.engines.mlx.constrained.conftest import LoadedModel
from tests.worker.engines.mlx.constrained.generation import (
    PROMPT,
    Generation,
    assert_valid_call,
    generate,
    marker_steering_processor,
    parse_hermes_calls,
    parse_llama3_call,
    prompt_length,
    split_strict_auto,
    steering_processor,
)
from tests.worker.engines.mlx.constrained.schemas import ALL_TOOLS, SEARCH, WEATHER

SEEDS = range(12)
PROPERTY_SEEDS = range(30)


def _constrained(
    tool_model: LoadedModel,
    spec: ToolConstraintSpec,
    seed: int,
    *,
    steer_to: str | None = None,
    steer_once: bool = False,
    end_boost: float = 5.0,
) -> Generation:
    model, tokenizer = tool_model
    processor = make_logits_processor(tokenizer, spec, prompt_length=prompt_length(tokenizer))
    steering = [steering_processor(tokenizer, end_boost=end_boost)]
    if steer_to is not None:
        steering.append(marker_steering_processor(tokenizer, steer_to, once=steer_once))
    generation = generate(model, tokenizer, [*steering, processor], seed=seed)
    assert generation.ended_with_eos, f"seed {seed}: the grammar never let the reply end: {generation.text!r}"
    return generation


def test_required_always_yields_valid_calls_to_the_given_tools(tool_model: LoadedModel) -> None:
    spec = ToolConstraintSpec(
        tool_format=ToolFormatName.HERMES, tools=ALL_TOOLS, shape=ReplyShape.CALLS, parallel_tool_calls=True
    )
    called: set[str] = set()
    for seed in PROPERTY_SEEDS:
        for call in parse_hermes_calls(_constrained(tool_model, spec, seed).text):
            assert_valid_call(call, ALL_TOOLS)
            called.add(call.name)
    # Many schemas were exercised, not one lucky path.
    assert len(called) >= 3, called


def test_named_choice_always_yields_exactly_one_call_to_that_tool(tool_model: LoadedModel) -> None:
    request_tools = [ToolDefinition(function=FunctionDefinition(**tool.model_dump())) for tool in ALL_TOOLS]
    for seed in SEEDS:
        named = ALL_TOOLS[seed % len(ALL_TOOLS)]
        tools = tuple(tool.function.tool_spec() for tool in request_tools if tool.function.name == named.name)
        spec = ToolConstraintSpec(
            tool_format=ToolFormatName.HERMES, tools=tools, shape=ReplyShape.CALLS, parallel_tool_calls=False
        )
        calls = parse_hermes_calls(_constrained(tool_model, spec, seed).text)
        assert [call.name for call in calls] == [named.name]
        assert_valid_call(calls[0], (named,))


def test_allowed_tools_are_never_escaped(tool_model: LoadedModel) -> None:
    request_tools = [ToolDefinition(function=FunctionDefinition(**tool.model_dump())) for tool in ALL_TOOLS]
    tools = tuple(tool.function.tool_spec() for tool in request_tools if tool.function.name in ("search", "move_file"))
    spec = ToolConstraintSpec(
        tool_format=ToolFormatName.HERMES, tools=tools, shape=ReplyShape.CALLS, parallel_tool_calls=True
    )
    for seed in SEEDS:
        for call in parse_hermes_calls(_constrained(tool_model, spec, seed).text):
            assert call.name in {"search", "move_file"}
            assert_valid_call(call, tools)


def test_parallel_tool_calls_false_yields_exactly_one_call(tool_model: LoadedModel) -> None:
    spec = ToolConstraintSpec(
        tool_format=ToolFormatName.HERMES, tools=ALL_TOOLS, shape=ReplyShape.CALLS, parallel_tool_calls=False
    )
    for seed in SEEDS:
        calls = parse_hermes_calls(_constrained(tool_model, spec, seed).text)
        assert len(calls) == 1
        assert_valid_call(calls[0], ALL_TOOLS)


@pytest.mark.parametrize(("parallel", "may_continue"), [(True, True), (False, False)])
def test_after_a_call_only_end_of_turn_or_a_parallel_call_may_follow(
    tool_model: LoadedModel, parallel: bool, may_continue: bool
) -> None:
    """Guards the test above: the single call comes from the grammar, not from the sampling's luck."""
    _, tokenizer = tool_model
    spec = ToolConstraintSpec(
        tool_format=ToolFormatName.HERMES, tools=ALL_TOOLS, shape=ReplyShape.CALLS, parallel_tool_calls=parallel
    )
    prompt = tokenizer.encode(PROMPT)
    call: list[int] = tokenizer.encode(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
    )
    processor = make_logits_processor(tokenizer, spec, prompt_length=len(prompt))
    logits = mx.zeros((1, tokenizer.vocab_size + 7))
    for end in range(len(call)):
        processor(mx.array(prompt + call[:end]), logits)
    masked = processor(mx.array(prompt + call), logits)
    allowed = {index for index in range(masked.shape[-1]) if masked[0, index].item() == 0.0}
    newline: list[int] = tokenizer.encode("\n")
    assert allowed == set(tokenizer.eos_token_ids) | (set(newline) if may_continue else set())


def test_strict_auto_yields_free_text_or_valid_calls(tool_model: LoadedModel) -> None:
    tools = (WEATHER, SEARCH)
    spec = ToolConstraintSpec(
        tool_format=ToolFormatName.HERMES, tools=tools, shape=ReplyShape.TEXT_OR_CALLS, parallel_tool_calls=True
    )
    replies_with_calls = replies_without_calls = 0
    for seed in SEEDS:
        # Steered to one call: after it the grammar lets go, and a push that never stops would open call after call
        # until the token limit.
        steer_to = "<tool_call>" if seed % 2 == 0 else None
        _, calls = split_strict_auto(_constrained(tool_model, spec, seed, steer_to=steer_to, steer_once=True).text)
        for call in calls:
            assert_valid_call(call, tools)
        replies_with_calls += bool(calls)
        replies_without_calls += not calls
    # Both branches were exercised: plain replies, and calls the marker steering opened and the grammar finished.
    assert replies_with_calls > 0
    assert replies_without_calls > 0


def test_reasoning_opened_by_the_prompt_is_free_then_the_named_call_follows(tool_model: LoadedModel) -> None:
    thinking = ReasoningMarkers(start="<think>", end="</think>", opened_in_prompt=True)
    spec = ToolConstraintSpec(
        tool_format=ToolFormatName.HERMES,
        tools=(SEARCH,),
        shape=ReplyShape.CALLS,
        parallel_tool_calls=False,
        reasoning=thinking,
    )
    for seed in SEEDS:
        generation = _constrained(tool_model, spec, seed, steer_to="</think>")
        _, separator, reply = generation.text.partition("</think>")
        assert separator, generation.text
        calls = parse_hermes_calls(reply.lstrip("\n"))
        assert [call.name for call in calls] == ["search"]
        assert_valid_call(calls[0], (SEARCH,))


def test_llama3_json_required_yields_one_valid_object(tool_model: LoadedModel) -> None:
    spec = ToolConstraintSpec(
        tool_format=ToolFormatName.LLAMA3_JSON, tools=ALL_TOOLS, shape=ReplyShape.CALLS, parallel_tool_calls=True
    )
    for seed in SEEDS:
        assert_valid_call(parse_llama3_call(_constrained(tool_model, spec, seed).text), ALL_TOOLS)


def test_unconstrained_output_of_the_same_model_is_not_a_call(tool_model: LoadedModel) -> None:
    """The random model cannot write calls by itself: the tests above prove the constraint, not the model."""
    model, tokenizer = tool_model
    for seed in SEEDS:
        text = generate(model, tokenizer, [steering_processor(tokenizer)], seed=seed, max_tokens=120).text
        with pytest.raises((AssertionError, ValueError)):
            parse_hermes_calls(text)


def test_plain_generation_is_untouched_by_constrained_requests(tool_model: LoadedModel) -> None:
    model, tokenizer = tool_model
    before = generate(model, tokenizer, [], seed=7, max_tokens=60)
    spec = ToolConstraintSpec(
        tool_format=ToolFormatName.HERMES, tools=ALL_TOOLS, shape=ReplyShape.CALLS, parallel_tool_calls=True
    )
    _constrained(tool_model, spec, seed=7)
    after = generate(model, tokenizer, [], seed=7, max_tokens=60)
    assert after.tokens == before.tokens
    assert after.text.encode() == before.text.encode()


def test_processors_from_the_cache_start_fresh(tool_model: LoadedModel) -> None:
    """A cached grammar is copied per request: a finished request leaves no state for the next one."""
    spec = ToolConstraintSpec(
        tool_format=ToolFormatName.HERMES, tools=(WEATHER,), shape=ReplyShape.CALLS, parallel_tool_calls=False
    )
    first = _constrained(tool_model, spec, seed=3)
    second = _constrained(tool_model, spec, seed=3)
    assert second.tokens == first.tokens
    assert_valid_call(parse_hermes_calls(second.text)[0], (WEATHER,))


def test_prompt_length_of_the_whole_conversation_still_works_when_mlx_lm_sees_only_a_suffix(
    tool_model: LoadedModel, caplog: pytest.LogCaptureFixture
) -> None:
    """With a prefix cache the runner hands mlx-lm only the uncached tokens; the processor anchors on what it sees."""
    caplog.set_level(logging.DEBUG, logger="exo.worker.engines.mlx.constrained.logits_processor")
    model, tokenizer = tool_model
    spec = ToolConstraintSpec(
        tool_format=ToolFormatName.HERMES, tools=(WEATHER,), shape=ReplyShape.CALLS, parallel_tool_calls=False
    )
    full_prompt_length = prompt_length(tokenizer) + 500
    processor = make_logits_processor(tokenizer, spec, prompt_length=full_prompt_length)
    generation = generate(model, tokenizer, [steering_processor(tokenizer), processor], seed=5)
    assert generation.ended_with_eos
    assert_valid_call(parse_hermes_calls(generation.text)[0], (WEATHER,))
    shown, counted = prompt_length(tokenizer), full_prompt_length
    assert f"grammar anchored on the {shown} prompt tokens mlx-lm showed (the caller counted {counted})" in caplog.text


def test_matchers_for_concurrent_requests_are_independent(tool_model: LoadedModel) -> None:
    """Requests on several threads copy the same cached grammar; each one's output is what it is alone."""
    spec = ToolConstraintSpec(
        tool_format=ToolFormatName.HERMES, tools=ALL_TOOLS, shape=ReplyShape.CALLS, parallel_tool_calls=True
    )
    _, tokenizer = tool_model
    replies = [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>',
        '<tool_call>\n{"name": "list_files", "arguments": {}}\n</tool_call>',
    ]

    def walk(reply: str) -> bool:
        tokens: list[int] = tokenizer.encode(reply)
        processor = make_logits_processor(tokenizer, spec, prompt_length=0)
        logits = mx.zeros((1, tokenizer.vocab_size + 7))
        for end in range(len(tokens)):
            if processor(mx.array(tokens[:end]), logits)[0, tokens[end]].item() != 0.0:
                return False
        return True

    with ThreadPoolExecutor(max_workers=4) as pool:
        assert all(pool.map(walk, replies * 4))


def test_compile_and_mask_cost_are_reported(tool_model: LoadedModel) -> None:
    """Prints the numbers the docs quote; asserts only that the cache makes the repeat cheaper."""
    model, tokenizer = tool_model
    spec = ToolConstraintSpec(
        tool_format=ToolFormatName.HERMES, tools=ALL_TOOLS, shape=ReplyShape.CALLS, parallel_tool_calls=True
    )
    guidance_tokenizer.cache_clear()  # cold: no cached tokenizer or grammar
    compiled_template.cache_clear()
    started = time.perf_counter()
    make_logits_processor(tokenizer, spec, prompt_length=0)
    cold = time.perf_counter() - started
    started = time.perf_counter()
    processor = make_logits_processor(tokenizer, spec, prompt_length=prompt_length(tokenizer))
    cached = time.perf_counter() - started
    started = time.perf_counter()
    constrained = generate(model, tokenizer, [steering_processor(tokenizer), processor], seed=1)
    constrained_step = (time.perf_counter() - started) / max(len(constrained.tokens), 1)
    started = time.perf_counter()
    plain = generate(model, tokenizer, [steering_processor(tokenizer)], seed=1, max_tokens=len(constrained.tokens) or 1)
    plain_step = (time.perf_counter() - started) / max(len(plain.tokens), 1)
    print(
        f"\ncompile cold {cold * 1e3:.1f} ms, cached {cached * 1e3:.2f} ms; per token constrained "
        f"{constrained_step * 1e3:.2f} ms vs plain {plain_step * 1e3:.2f} ms"
    )
    assert cached < cold


def test_definitions_are_not_mutated_by_grammar_building() -> None:
    original = ToolSpec.model_validate(WEATHER.model_dump())
    spec = ToolConstraintSpec(
        tool_format=ToolFormatName.HERMES, tools=(WEATHER,), shape=ReplyShape.CALLS, parallel_tool_calls=False
    )
    from exo.tool_calls.request_grammar import build_tool_grammar

    build_tool_grammar(spec)
    assert original == WEATHER
