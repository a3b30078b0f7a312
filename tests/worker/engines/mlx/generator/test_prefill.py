"""Prefill in pieces sized by time per layer: the pacer's sizing, answers that do not depend on the piece sizes, a
cancel between pieces that keeps what was computed, and the debugging floor that slows a prefill on purpose."""

import time

import pytest

from exo.shared.types.chunks import FinishChunk, PrefillProgressChunk
from exo.shared.types.worker.decode_settings import DecodeSettings
from exo.worker.engines.mlx.cache.layer_cache import held_token_count, new_prompt_cache
from exo.worker.engines.mlx.generator.chat_completion import ChatRequest
from exo.worker.engines.mlx.generator.prefill import (
    FIRST_PIECE_TOKENS,
    MAX_GROWTH,
    MAX_PIECE_TOKENS,
    MIN_PIECE_TOKENS,
    SLOW_PREFILL_VARIABLE,
    PiecePacer,
    PromptPrefill,
    slow_prefill_seconds_per_token,
)
from exo.worker.engines.mlx.generator.scheduler import GenerationScheduler
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR, user
from tests.worker.engines.mlx.generator.scheduling import JsonBody, engine_context, run, run_alone, task

TARGET = 0.3
LONG_CONVERSATION: JsonBody = {"messages": [user("tell me about the weather " * 120)], "max_tokens": 6}


def test_each_next_piece_is_sized_so_one_layer_takes_the_target_time() -> None:
    pacer = PiecePacer(TARGET)
    assert pacer.size == FIRST_PIECE_TOKENS

    pacer.record(200, 2 * TARGET * 4, layers=4)  # each of 4 layers took twice the target: half as many tokens
    assert pacer.size == 100
    pacer.record(100, TARGET * 4, layers=4)  # on target: the same again
    assert pacer.size == 100
    pacer.record(100, 0.001, layers=4)  # far under the target: grows, but only by MAX_GROWTH at a time
    assert pacer.size == int(100 * MAX_GROWTH)
    pacer.record(100, 2 * TARGET, layers=0)  # a model that cannot pause between layers: the pass is the unit
    assert pacer.size == 50


def test_pieces_stay_within_bounds() -> None:
    pacer = PiecePacer(TARGET)
    for _ in range(8):
        pacer.record(pacer.size, 0.0, layers=4)
    assert pacer.size == MAX_PIECE_TOKENS
    pacer.record(100, 60.0, layers=4)  # never below the size where a pass is worth its cost
    assert pacer.size == MIN_PIECE_TOKENS
    with pytest.raises(ValueError, match="positive"):
        PiecePacer(0)


def test_a_piece_cut_short_by_the_prompts_end_only_shrinks_the_next() -> None:
    pacer = PiecePacer(TARGET)
    pacer.record(20, 0.001, layers=4)  # a short prompt's only piece, fast: says nothing about a longer one
    assert pacer.size == FIRST_PIECE_TOKENS
    for _ in range(8):
        pacer.record(pacer.size, 0.0, layers=4)
    assert pacer.size == MAX_PIECE_TOKENS
    pacer.record(20, 0.001, layers=4)  # after a long prompt's pieces, the next long prompt starts where they ended
    assert pacer.size == MAX_PIECE_TOKENS
    pacer.record(64, 2 * TARGET * 4, layers=4)  # even 64 tokens took twice the target a layer: shrinks
    assert pacer.size == MIN_PIECE_TOKENS


def test_the_answer_does_not_depend_on_the_piece_sizes() -> None:
    slow = DecodeSettings(batch_size=1, speculation=None, prefill_piece_seconds=1e-6)  # the smallest pieces
    fast = DecodeSettings(batch_size=1, speculation=None, prefill_piece_seconds=60)
    model = FIXTURE_MODELS_DIR / "tiny-qwen-tools"

    by_token = run_alone(engine_context(model, slow), task(LONG_CONVERSATION))
    by_large_pieces = run_alone(engine_context(model, fast), task(LONG_CONVERSATION))

    assert by_token.normalised() == by_large_pieces.normalised()
    assert isinstance(by_token.last, FinishChunk)


def test_a_cancel_between_pieces_leaves_what_was_prefilled_in_the_prefix_cache() -> None:
    settings = DecodeSettings(batch_size=1, speculation=None, prefill_piece_seconds=1e-6)
    context = engine_context(FIXTURE_MODELS_DIR / "tiny-qwen-tools", settings, prefix_cache_bytes=1 << 26)
    scheduler = GenerationScheduler(context.loaded.model, settings)
    first = task(LONG_CONVERSATION)
    request = ChatRequest.open(context, first)
    cache = request.take_cache()
    scheduler.admit(request)

    progress: list[int] = []
    while len(progress) < 5:
        for update in scheduler.step():
            assert update.task_id == first.task_id
            assert not update.done
            (chunk,) = update.chunks
            assert isinstance(chunk, PrefillProgressChunk)
            assert chunk.prompt_tokens == len(request.prompt_tokens)
            progress.append(chunk.done_tokens)
    prefilled = held_token_count(cache)
    assert prefilled is not None
    assert 0 < prefilled < len(request.prompt_tokens) - 1
    # One report per piece, each further on, the last one saying what the cache holds.
    assert len(progress) == 5
    assert progress == sorted(set(progress))
    assert progress[-1] == prefilled
    usage = scheduler.cancel(first.task_id)
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (len(request.prompt_tokens), 0)
    assert scheduler.active == 0

    again = ChatRequest.open(context, task(LONG_CONVERSATION))
    assert again.cached_tokens == prefilled


def test_the_prefix_cache_is_told_what_each_prefill_piece_cost() -> None:
    settings = DecodeSettings(batch_size=1, speculation=None, prefill_piece_seconds=1e-6)  # many pieces
    context = engine_context(FIXTURE_MODELS_DIR / "tiny-qwen-tools", settings, prefix_cache_bytes=1 << 26)
    prefix_cache = context.prefix_cache
    assert prefix_cache is not None
    pieces: list[tuple[int, float]] = []

    def told(tokens: int, seconds: float) -> None:
        pieces.append((tokens, seconds))
        prefix_cache.prefilled(tokens, seconds)

    one = task(LONG_CONVERSATION)
    run(context, {0: [one]}, scheduler=GenerationScheduler(context.loaded.model, settings, on_prefill_piece=told))

    request = ChatRequest.open(context, task(LONG_CONVERSATION))
    assert len(pieces) > 1
    assert sum(tokens for tokens, _ in pieces) == len(request.prompt_tokens) - 1  # all but the decoder's last token
    assert all(seconds > 0 for _, seconds in pieces)
    measured = prefix_cache.load_or_prefill.prefill_seconds_per_token
    assert measured is not None
    assert 0 < measured < 1


def test_a_floor_per_token_makes_the_prefill_last_at_least_that_long_in_short_steps() -> None:
    context = engine_context(FIXTURE_MODELS_DIR / "tiny-qwen-tools", DecodeSettings(batch_size=1, speculation=None))
    prompt = list(range(10, 310))
    floor = 0.01  # 3 s for 299 tokens: far longer than the tiny model takes to read them
    pacer = PiecePacer(TARGET, floor_seconds_per_token=floor)
    prefill = PromptPrefill(context.loaded.model, new_prompt_cache(context.loaded.model), prompt, pacer)
    started = time.monotonic()
    longest_step = 0.0
    while not prefill.finished:
        before = time.monotonic()
        prefill.step()
        longest_step = max(longest_step, time.monotonic() - before)
    assert time.monotonic() - started >= floor * (len(prompt) - 1)
    assert prefill.fed == prompt[:-1]
    # Held back in steps of the pacer's step time, so the runner still reads its messages (a cancel) between them;
    # the slack is for a piece's own layers on a loaded machine.
    assert longest_step < pacer.step_seconds + 1.0


def test_without_the_variable_nothing_is_slowed_and_a_bad_value_is_refused() -> None:
    assert slow_prefill_seconds_per_token({}) == 0.0
    assert slow_prefill_seconds_per_token({SLOW_PREFILL_VARIABLE: " 0.005 "}) == 0.005
    for bad in ("fast", "-1", "nan"):
        with pytest.raises(ValueError, match=SLOW_PREFILL_VARIABLE):
            slow_prefill_seconds_per_token({SLOW_PREFILL_VARIABLE: bad})
