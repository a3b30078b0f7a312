"""A decode step as one ggml graph (`decode_graph.py`, issue 33): installed where the CPU engine holds a qwen2 or
llama model's matrices in ggml, it writes the same greedy tokens as mlx-lm's model with ggml's products inside,
alone and batched, its logits within the products' quantization error, and leaves each layer's KV cache as that
model's step does, so that trimming a step, a later prefill and every cache built on mlx-lm's see the same; any
other call (prefill, a draft's verification, no cache) is the model's own.

These tests need ggml's CPU library (`uv run exo ggml build`, or EXO_GGML_DIR): without it they skip for a reason of
the machine, a failure under EXO_STRICT_SKIPS=1.
"""

import copy
import gc
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import mlx.core as mx
import numpy as np
import pytest
from mlx import nn
from mlx_lm.models.cache import BatchKVCache, KVCache, make_prompt_cache, trim_prompt_cache
from mlx_lm.utils import load_model as mlx_lm_load_model

from exo.shared.types.cpu_kernels import CpuWeightsSetting
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.cache.layer_cache import PromptCache
from exo.worker.engines.mlx.cache.owned_kv_cache import buffers_of, state
from exo.worker.engines.mlx.cpu import decode_graph, engine
from exo.worker.engines.mlx.cpu.decode_graph import MAX_PASS_TOKENS, SPAN_STEP, DecodeGraph, decode_graph_of
from exo.worker.engines.mlx.cpu.engine import DECODE_GRAPH_VARIABLE, CpuKernels
from exo.worker.engines.mlx.cpu.gguf_layers import FileEmbedding
from exo.worker.engines.mlx.discarded_logits import logits_discarded
from exo.worker.engines.mlx.generator import batch_step, sampling
from exo.worker.engines.mlx.generator.processors import RequestProcessors
from exo.worker.engines.mlx.generator.sampling import GREEDY
from exo.worker.engines.mlx.generator.solo import SoloDecoder
from exo.worker.engines.mlx.model_loader import load_model as exo_load_model
from exo.worker.engines.mlx.step_clock import STEP_CLOCK, StepPart
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR, FixtureModelName
from tests.worker.engines.mlx.cpu.gguf_export import export_fixture
from tests.worker.engines.mlx.cpu.weight_formats import (
    assert_within_product_rounding,
    graph_and_plain,
    loaded_fixture,
    mismatched_trained_cases,
)
from tests.worker.engines.mlx.generator.batch_generation import generate

PROMPT = [(index * 13) % 200 + 5 for index in range(40)]
OTHER_TOKEN = 7


class _Counting:
    """Counts the steps the graph computes (wraps an installed graph's `_run`), and those it resumed over the caches
    the step before it wrote (its `resume`)."""

    def __init__(self, step: DecodeGraph, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        self.resumed = 0
        run, resume = step._run, step.resume  # pyright: ignore[reportPrivateUsage]

        def counted_run(*args: object, **kwargs: object) -> mx.array:
            self.calls += 1
            return run(*args, **kwargs)  # pyright: ignore[reportArgumentType]

        def counted_resume(inputs: mx.array, caches: object) -> mx.array | None:
            logits = resume(inputs, caches)
            self.resumed += logits is not None
            return logits

        monkeypatch.setattr(step, "_run", counted_run)
        monkeypatch.setattr(step, "resume", counted_resume)


class _CountedBuilds:
    """Counts the step graphs a graph builds (wraps its `_build_step`)."""

    def __init__(self, step: DecodeGraph, monkeypatch: pytest.MonkeyPatch) -> None:
        self.builds = 0
        build = step._build_step  # pyright: ignore[reportPrivateUsage]

        def counted(*args: object, **kwargs: object) -> object:
            self.builds += 1
            return build(*args, **kwargs)  # pyright: ignore[reportArgumentType]

        monkeypatch.setattr(step, "_build_step", counted)


def _decode(model: nn.Module, cache: list[KVCache], first: int, steps: int) -> tuple[list[np.ndarray], list[int]]:
    """`steps` greedy one-token steps from `first`: each step's logits and the tokens chosen."""
    outputs: list[np.ndarray] = []
    tokens: list[int] = []
    token = first
    for _ in range(steps):
        logits = model(mx.array([[token]]), cache=cache)
        mx.eval(logits)
        outputs.append(np.array(logits).reshape(-1))
        token = int(np.argmax(outputs[-1]))
        tokens.append(token)
    return outputs, tokens


def _held_alike(
    ours: list[KVCache], theirs: list[KVCache], offset: int
) -> list[tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]]:
    """Both caches hold `offset` positions in every layer, our keys and values within the products' rounding of
    theirs; each layer's (keys, values) held, ours then theirs."""
    held: list[tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]] = []
    for mine, other in zip(ours, theirs, strict=True):
        assert mine.offset == other.offset == offset
        pairs: list[tuple[np.ndarray, np.ndarray]] = []
        for layer in (mine, other):
            keys, values = buffers_of(layer)
            assert keys is not None
            assert values is not None
            pairs.append((np.array(keys[..., :offset, :]), np.array(values[..., :offset, :])))
        for a, b in zip(*pairs, strict=True):
            assert_within_product_rounding(a, b)
        held.append((pairs[0], pairs[1]))
    return held


def _prefilled(model: nn.Module, prompt: list[int]) -> tuple[list[KVCache], int]:
    cache = cast(list[KVCache], make_prompt_cache(model))
    logits = model(mx.array([prompt]), cache=cache)
    mx.eval(logits)
    return cache, int(np.argmax(np.array(logits[0, -1])))


@pytest.mark.usefixtures("ggml")
@pytest.mark.parametrize("weights", ["q8_0", "gguf"])
@pytest.mark.parametrize("name", ["tiny-qwen-tools", "tiny-llama31-tools"])
def test_a_model_decodes_one_token_a_graph_as_mlx_lms_model_does(
    name: FixtureModelName, weights: CpuWeightsSetting, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    graph, plain = graph_and_plain(name, weights, monkeypatch, tmp_path, off=(DECODE_GRAPH_VARIABLE,))
    step = decode_graph_of(graph)
    assert step is not None
    assert decode_graph_of(plain) is None
    counting = _Counting(step, monkeypatch)
    graph_cache, first = _prefilled(graph, PROMPT)
    plain_cache, plain_first = _prefilled(plain, PROMPT)
    assert counting.calls == 0  # prefill (40 rows) is the model's own
    assert first == plain_first
    graph_logits, graph_tokens = _decode(graph, graph_cache, first, steps=8)
    plain_logits, plain_tokens = _decode(plain, plain_cache, first, steps=8)
    assert counting.calls == 8
    # The first step appends through mlx (the prefill shares the buffers), the second writes in place, and the six
    # after it resume the one before (`DecodeGraph.resume`).
    assert counting.resumed == 6
    assert graph_tokens == plain_tokens
    for a, b in zip(graph_logits, plain_logits, strict=True):
        assert_within_product_rounding(a, b)
    # The caches hold what mlx-lm's steps leave: the same positions, the same keys and values.
    for ours, theirs in _held_alike(graph_cache, plain_cache, len(PROMPT) + 8):
        np.testing.assert_array_equal(ours[0][..., : len(PROMPT), :], theirs[0][..., : len(PROMPT), :])


@pytest.mark.usefixtures("ggml")
@pytest.mark.parametrize("name", ["tiny-qwen-tools", "tiny-llama31-tools"])
def test_an_untied_models_steps_read_their_embedding_rows_from_the_file(
    name: FixtureModelName, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The step writes its tokens' rows of a table read from the GGUF: the logits are exactly those of the same
    blocks held (the tied export, whose head is the same Q8_0 table), and mlx-lm's steps pick the same tokens."""
    graph, plain = graph_and_plain(name, "gguf", monkeypatch, tmp_path, off=(DECODE_GRAPH_VARIABLE,), untied=True)
    assert isinstance(graph["model"]["embed_tokens"], FileEmbedding)
    step = decode_graph_of(graph)
    assert step is not None
    counting = _Counting(step, monkeypatch)
    held = loaded_fixture(name, "gguf", export_fixture(name, tmp_path / "tied" / name)).model
    assert decode_graph_of(held) is not None
    graph_cache, first = _prefilled(graph, PROMPT)
    plain_cache, plain_first = _prefilled(plain, PROMPT)
    held_cache, held_first = _prefilled(held, PROMPT)
    assert first == plain_first == held_first
    graph_logits, graph_tokens = _decode(graph, graph_cache, first, steps=8)
    plain_logits, plain_tokens = _decode(plain, plain_cache, first, steps=8)
    held_logits, _ = _decode(held, held_cache, first, steps=8)
    assert counting.calls == 8
    assert graph_tokens == plain_tokens
    for ours, theirs, tied in zip(graph_logits, plain_logits, held_logits, strict=True):
        assert_within_product_rounding(ours, theirs)
        np.testing.assert_array_equal(ours, tied)


@pytest.mark.usefixtures("ggml")
def test_a_trimmed_step_and_a_later_prefill_see_what_mlx_lms_steps_leave(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    graph, plain = graph_and_plain("tiny-qwen-tools", "gguf", monkeypatch, tmp_path, off=(DECODE_GRAPH_VARIABLE,))
    results: list[list[int]] = []
    for model in (graph, plain):
        cache, first = _prefilled(model, PROMPT)
        _, tokens = _decode(model, cache, first, steps=5)
        assert trim_prompt_cache(cast(list[object], cache), 3) == 3  # a discarded chained step, a rejected draft
        # Several rows after the graph's steps: a draft verified, a follow-up prompt prefilled.
        logits = model(mx.array([[tokens[1], tokens[2], 7, 9]]), cache=cache)
        mx.eval(logits)
        _, more = _decode(model, cache, int(np.argmax(np.array(logits[0, -1]))), steps=6)
        results.append(tokens[:2] + more)
        assert cache[0].offset == len(PROMPT) + 5 - 3 + 4 + 6
    assert results[0] == results[1]


@pytest.mark.usefixtures("ggml")
def test_one_token_steps_after_a_trim_write_where_the_trimmed_cache_ends(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A trim touches no buffer (the cache still owns them), only the count held: the step after it is computed from
    the cache as it is, not resumed where the step before it ended."""
    graph, plain = graph_and_plain("tiny-qwen-tools", "gguf", monkeypatch, tmp_path, off=(DECODE_GRAPH_VARIABLE,))
    step = decode_graph_of(graph)
    assert step is not None
    counting = _Counting(step, monkeypatch)
    results: list[tuple[list[np.ndarray], list[int], list[KVCache]]] = []
    for model in (graph, plain):
        cache, first = _prefilled(model, PROMPT)
        logits, tokens = _decode(model, cache, first, steps=5)
        assert trim_prompt_cache(cast(list[object], cache), 2) == 2  # a discarded chained step, a rejected draft
        more_logits, more = _decode(model, cache, tokens[2], steps=5)
        results.append((logits + more_logits, tokens + more, cache))
    (graph_logits, graph_tokens, graph_cache), (plain_logits, plain_tokens, plain_cache) = results
    assert graph_tokens == plain_tokens
    for a, b in zip(graph_logits, plain_logits, strict=True):
        assert_within_product_rounding(a, b)
    _held_alike(graph_cache, plain_cache, len(PROMPT) + 5 - 2 + 5)
    # Steps 3-5 resume the step before; after the trim the first step is computed anew, the four after it resume.
    assert (counting.calls, counting.resumed) == (10, 3 + 4)


@pytest.mark.usefixtures("ggml")
def test_the_graph_does_not_keep_a_finished_requests_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """The record of the caches the last step wrote (`DecodeGraph.resume`) holds them weakly: a finished request's
    cache, and its buffers, are freed when the request lets go of them."""
    graph = loaded_fixture("tiny-qwen-tools", "q8_0").model
    step = decode_graph_of(graph)
    assert step is not None
    counting = _Counting(step, monkeypatch)
    cache, first = _prefilled(graph, PROMPT)
    _decode(graph, cache, first, steps=4)
    assert counting.resumed == 2
    layer = weakref.ref(cache[0])
    keys = buffers_of(cache[0])[0]
    assert keys is not None
    held_keys = weakref.ref(keys)
    del cache, keys
    gc.collect()
    assert layer() is None
    assert held_keys() is None


@pytest.mark.usefixtures("ggml")
def test_steps_past_the_caches_capacity_grow_it_as_mlx_lms_steps_do(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The graph appends a step's keys and values in place while the buffers have room, and through mlx-lm's
    `update_and_fetch` (which grows them) at their end: decoding across a buffer's end leaves what mlx-lm's steps do."""
    graph, plain = graph_and_plain("tiny-qwen-tools", "gguf", monkeypatch, tmp_path, off=(DECODE_GRAPH_VARIABLE,))
    step = decode_graph_of(graph)
    assert step is not None
    counting = _Counting(step, monkeypatch)
    prompt = [(index * 7) % 200 + 5 for index in range(KVCache.step - 4)]
    results: list[tuple[list[int], list[KVCache]]] = []
    for model in (graph, plain):
        cache, first = _prefilled(model, prompt)
        capacity = cache[0].keys.shape[2] if cache[0].keys is not None else 0
        assert capacity == KVCache.step
        _, tokens = _decode(model, cache, first, steps=8)  # 4 with room, the 5th grows the buffers
        results.append((tokens, cache))
    assert counting.calls == 8
    (graph_tokens, graph_cache), (plain_tokens, plain_cache) = results
    assert graph_tokens == plain_tokens
    _held_alike(graph_cache, plain_cache, len(prompt) + 8)
    for ours, theirs in zip(graph_cache, plain_cache, strict=True):
        assert ours.keys is not None
        assert theirs.keys is not None
        assert ours.keys.shape == theirs.keys.shape == (1, ours.keys.shape[1], 2 * KVCache.step, ours.keys.shape[3])


@pytest.mark.usefixtures("ggml")
@pytest.mark.parametrize("taken", ["deep copy", "view"])
def test_copies_and_views_taken_between_steps_keep_what_they_held(
    taken: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Once a cache owns its buffers the graph writes steps into them in place (`owned_kv_cache.py`). A deep copy (the
    prefix cache's lease of a stored entry: mlx's deep copy shares the buffers) or a view taken between steps keeps
    what it held while the original, trimmed, decodes other tokens into those positions; the copy then decodes on
    its own; the tokens are the model's without the graph."""
    graph, plain = graph_and_plain("tiny-qwen-tools", "gguf", monkeypatch, tmp_path, off=(DECODE_GRAPH_VARIABLE,))
    cache, first = _prefilled(graph, PROMPT)
    _, tokens = _decode(graph, cache, first, steps=4)
    assert all(state(layer) == "owned" for layer in cache)  # the steps after the first wrote in place
    assert tokens[0] != OTHER_TOKEN
    held = cache[0].offset

    # What each holder held, read without counting as an outside use (the copy or view itself is the only one).
    snapshot = copy.deepcopy(cache) if taken == "deep copy" else None
    view = cache[-1].keys[..., :held, :] if taken == "view" and cache[-1].keys is not None else None
    holders = snapshot if snapshot is not None else []
    expected = [tuple(np.array(array) for array in buffers_of(layer)) for layer in holders]
    expected_view = None if view is None else np.array(view)

    assert trim_prompt_cache(cast(list[object], cache), 3) == 3
    # Another token where the trimmed ones were: new keys at positions the copy or the view holds.
    _, more = _decode(graph, cache, OTHER_TOKEN, steps=6)
    if view is not None:
        np.testing.assert_array_equal(np.array(view), expected_view)
    for layer, arrays in zip(holders, expected, strict=True):
        for array, before in zip(buffers_of(layer), arrays, strict=True):
            np.testing.assert_array_equal(np.array(array)[..., :held, :], before[..., :held, :])
    copied_more = _decode(graph, snapshot, tokens[-1], steps=6)[1] if snapshot is not None else []

    plain_cache, _ = _prefilled(plain, PROMPT)
    _, plain_tokens = _decode(plain, plain_cache, first, steps=4)
    plain_copy = copy.deepcopy(plain_cache)
    assert trim_prompt_cache(cast(list[object], plain_cache), 3) == 3
    _, plain_more = _decode(plain, plain_cache, OTHER_TOKEN, steps=6)
    plain_copied_more = _decode(plain, plain_copy, tokens[-1], steps=6)[1] if snapshot is not None else []
    assert (tokens, more, copied_more) == (plain_tokens, plain_more, plain_copied_more)
    _held_alike(cache, plain_cache, len(PROMPT) + 4 - 3 + 6)
    for layer, arrays in zip(holders, expected, strict=True):  # the copy's own steps kept what it held too
        assert layer.offset == held + 6
        for array, before in zip(buffers_of(layer), arrays, strict=True):
            np.testing.assert_array_equal(np.array(array)[..., :held, :], before[..., :held, :])


@pytest.mark.usefixtures("ggml")
def test_a_graphs_greedy_tokens_are_picked_on_the_host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The graph's steps leave their logits on the host: a greedy pick is numpy's there, alone (`SoloDecoder`) and
    in a batch (`LazyLogprobsBatch`), and the tokens are those mlx's argmax picks without the graph."""
    graph, plain = graph_and_plain("tiny-qwen-tools", "q8_0", monkeypatch, tmp_path, off=(DECODE_GRAPH_VARIABLE,))
    picks: list[bool] = []
    pick = sampling.greedy_rows

    def counted(logits: mx.array, *, on_host: bool = False) -> mx.array:
        picks.append(on_host)
        return pick(logits, on_host=on_host)

    monkeypatch.setattr(sampling, "greedy_rows", counted)
    monkeypatch.setattr(batch_step, "greedy_rows", counted)
    results: list[tuple[list[int], list[list[int]]]] = []
    for model in (graph, plain):
        cache, first = _prefilled(model, PROMPT)
        decoder = SoloDecoder(
            model,
            cast(PromptCache, cache),
            fed=[],
            pending=[first],
            sampler=GREEDY,
            processors=RequestProcessors([], ()),
            drafts=None,
        )
        alone: list[int] = []
        for _ in range(6):
            decoder.launch(0)
            alone += decoder.collect()
        batched, _ = generate(model, [GREEDY] * 3, lazy=True, prompts=[PROMPT, PROMPT[:17], PROMPT[5:30]], steps=6)
        assert all(len(member) == 6 for member in batched)
        results.append((alone, batched))
        # Every pick of this model's steps: on the host with the graph, mlx's without.
        assert picks
        assert set(picks) == {model is graph}
        picks.clear()
    assert results[0] == results[1]


@pytest.mark.usefixtures("ggml")
def test_one_row_steps_and_a_drafts_passes_keep_their_graphs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A request verifying drafts alternates one-row steps with passes of a few rows: each kind's graph is kept for
    the next time (`KEPT_STEPS`), not rebuilt at every switch, and the tokens are the model's without the graph."""
    graph, plain = graph_and_plain("tiny-qwen-tools", "gguf", monkeypatch, tmp_path, off=(DECODE_GRAPH_VARIABLE,))
    step = decode_graph_of(graph)
    assert step is not None
    built = _CountedBuilds(step, monkeypatch)
    chosen: list[list[int]] = []
    for model in (graph, plain):
        cache, token = _prefilled(model, PROMPT)
        tokens: list[int] = []
        for _ in range(6):  # a step, then a 3-row pass of which one row is kept (a draft rejected after one token)
            logits = model(mx.array([[token]]), cache=cache)
            token = int(np.argmax(np.array(logits[0, -1])))
            logits = model(mx.array([[token, 5, 6]]), cache=cache)
            assert trim_prompt_cache(cast(list[object], cache), 2) == 2
            token = int(np.argmax(np.array(logits[0, 0])))
            tokens.append(token)
        chosen.append(tokens)
    assert chosen[0] == chosen[1]
    # The first step's graph (its buffers shared after the prefill), then one graph of each kind writing in place.
    assert built.builds == 3


@pytest.mark.usefixtures("ggml")
def test_other_calls_are_the_models_own(monkeypatch: pytest.MonkeyPatch) -> None:
    graph = loaded_fixture("tiny-qwen-tools", "q8_0").model
    step = decode_graph_of(graph)
    assert step is not None
    counting = _Counting(step, monkeypatch)
    cache, first = _prefilled(graph, PROMPT)
    mx.eval(graph(mx.array([[first] * (MAX_PASS_TOKENS + 1)]), cache=cache))  # more rows than a verification
    with logits_discarded():  # a prefill piece whose logits are thrown away
        mx.eval(graph(mx.array([[first]]), cache=cache))
    mx.eval(graph(mx.array([[first]])))  # no cache
    # A batch's prefill (three positions), then one whose caches are empty: the model's own.
    mx.eval(graph(mx.array([[1, 2, 3]]), cache=[BatchKVCache(left_padding=[0]) for _ in cache]))
    mx.eval(graph(mx.array([[1]]), cache=[BatchKVCache(left_padding=[0]) for _ in cache]))
    assert counting.calls == 0
    mx.eval(graph(mx.array([[first]]), cache=cache))
    assert counting.calls == 1


@pytest.mark.usefixtures("ggml")
@pytest.mark.parametrize("name", ["tiny-qwen-tools", "tiny-qwen-agent"])
def test_fixture_models_keep_their_trained_answers_through_the_graph(name: FixtureModelName) -> None:
    assert decode_graph_of(loaded_fixture(name, "q8_0").model) is not None
    assert mismatched_trained_cases(name, "q8_0") == []


def _report_line(name: FixtureModelName) -> tuple[bool, str]:
    """Whether the fixture, loaded as a runner loads it under `--cpu-weights q8_0`, has the graph, and the
    runner's report line."""
    kernels = CpuKernels("auto", weights="q8_0")
    model = exo_load_model(FIXTURE_MODELS_DIR / name, ShardAssignment(), cpu_kernels=kernels).model
    return decode_graph_of(model) is not None, kernels.report().describe()


@pytest.mark.usefixtures("ggml")
def test_the_report_says_where_the_graph_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    installed, line = _report_line("tiny-qwen-tools")
    assert installed
    assert "decode steps as one ggml graph" in line.split("; off:")[0]
    # A model the graph does not compute (a qwen3's q/k norms, a scaled rope, a pipeline stage) keeps mlx-lm's steps.
    monkeypatch.setattr(engine, "decode_graph_for", lambda *_: None)
    installed, line = _report_line("tiny-qwen-tools")
    assert not installed
    assert "decode steps as one ggml graph (not built for a qwen2 model held this way)" in line
    monkeypatch.undo()
    monkeypatch.setenv(DECODE_GRAPH_VARIABLE, "off")
    installed, line = _report_line("tiny-qwen-tools")
    assert not installed
    assert f"decode steps as one ggml graph ({DECODE_GRAPH_VARIABLE}=off)" in line


def _left_padded(model: nn.Module, prompts: list[list[int]]) -> tuple[list[BatchKVCache], mx.array]:
    """The prompts as one left-padded batch (padded to the longest) and a batch cache a layer for it."""
    longest = max(len(prompt) for prompt in prompts)
    padding = [longest - len(prompt) for prompt in prompts]
    cache = [BatchKVCache(left_padding=padding) for _ in range(len(cast(list[nn.Module], model["model"]["layers"])))]
    return cache, mx.array([[0] * pad + prompt for pad, prompt in zip(padding, prompts, strict=True)])


def _batched(model: nn.Module, prompts: list[list[int]], steps: int) -> tuple[list[np.ndarray], list[list[int]]]:
    """The prompts prefilled as one left-padded batch, then `steps` greedy steps of the batch: each step's logits
    (sequences × vocabulary) and each sequence's tokens."""
    cache, rows = _left_padded(model, prompts)
    logits = model(rows, cache=cache)
    mx.eval(logits)
    tokens = np.argmax(np.array(logits[:, -1]), axis=-1)
    outputs: list[np.ndarray] = []
    chosen: list[list[int]] = [[] for _ in prompts]
    for _ in range(steps):
        logits = model(mx.array(tokens.reshape(-1, 1)), cache=cache)
        mx.eval(logits)
        outputs.append(np.array(logits).reshape(len(prompts), -1))
        tokens = np.argmax(outputs[-1], axis=-1)
        for row, token in zip(chosen, tokens.tolist(), strict=True):
            row.append(int(token))
    return outputs, chosen


@pytest.mark.usefixtures("ggml")
@pytest.mark.parametrize("name", ["tiny-qwen-tools", "tiny-llama31-tools"])
def test_a_batch_of_different_lengths_decodes_as_mlx_lms_model_does(
    name: FixtureModelName, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    graph, plain = graph_and_plain(name, "q8_0", monkeypatch, tmp_path, off=(DECODE_GRAPH_VARIABLE,))
    step = decode_graph_of(graph)
    assert step is not None
    counting = _Counting(step, monkeypatch)
    prompts = [PROMPT, PROMPT[:17], [9, 8, 7, *PROMPT[5:30]]]  # left padding 0, 23 and 12
    graph_logits, graph_tokens = _batched(graph, prompts, steps=6)
    plain_logits, plain_tokens = _batched(plain, prompts, steps=6)
    assert counting.calls == 6
    assert graph_tokens == plain_tokens
    for a, b in zip(graph_logits, plain_logits, strict=True):
        for row_a, row_b in zip(a, b, strict=True):
            assert_within_product_rounding(row_a, row_b)
    # Each sequence of the batch decodes as it does alone.
    for prompt, tokens in zip(prompts, graph_tokens, strict=True):
        cache, first = _prefilled(graph, prompt)
        _, alone = _decode(graph, cache, first, steps=6)
        assert alone == tokens


@pytest.mark.usefixtures("ggml")
def test_one_batch_graph_is_kept_beside_one_sequences_graphs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A batch's graph holds a buffer of sequences × vocabulary logits: a graph for another batch replaces it rather
    than joining it, while one sequence's graphs are kept beside it."""
    graph, _ = graph_and_plain("tiny-qwen-tools", "gguf", monkeypatch, tmp_path, off=(DECODE_GRAPH_VARIABLE,))
    step = decode_graph_of(graph)
    assert step is not None
    cache, first = _prefilled(graph, PROMPT)
    _decode(graph, cache, first, steps=3)
    _batched(graph, [PROMPT, PROMPT[:17], PROMPT[3:30]], steps=2)
    _batched(graph, [PROMPT, PROMPT[:20]], steps=2)
    kept = step._steps._kept  # pyright: ignore[reportPrivateUsage]
    batches = [len(graph.key.starts) for graph in kept]
    assert batches.count(1) >= 1
    assert [count for count in batches if count > 1] == [2]


@pytest.mark.usefixtures("ggml")
def test_a_rank_of_a_split_model_keeps_mlx_lms_steps() -> None:
    # A pipeline stage or tensor rank passes its steps through the other ranks: the graph would compute alone.
    path = FIXTURE_MODELS_DIR / "tiny-qwen-tools"
    model, _ = mlx_lm_load_model(path, lazy=True)
    kernels = CpuKernels("auto", weights="q8_0")
    assert kernels.prepare_model(model, path, split=True) == "q8_0"
    assert decode_graph_of(model) is None
    assert "decode steps as one ggml graph (a rank of a split model)" in kernels.report().describe()


@pytest.mark.usefixtures("ggml")
@pytest.mark.parametrize("weights", ["q8_0", "gguf"])
@pytest.mark.parametrize("name", ["tiny-qwen-tools", "tiny-llama31-tools"])
def test_a_drafts_verification_is_one_graph_with_mlx_lms_logits_and_cache(
    name: FixtureModelName, weights: CpuWeightsSetting, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Several rows of one sequence (a draft's verification: each row sees the rows before it) run as one graph:
    every row's logits and the keys and values it leaves are those of the model with the graph off (its layers' own
    passes), within the products' rounding."""
    graph, plain = graph_and_plain(name, weights, monkeypatch, tmp_path, off=(DECODE_GRAPH_VARIABLE,))
    step = decode_graph_of(graph)
    assert step is not None
    graph_cache, first = _prefilled(graph, PROMPT)
    plain_cache, _ = _prefilled(plain, PROMPT)
    counting = _Counting(step, monkeypatch)
    draft = [first, *PROMPT[3:8]]
    ours = np.array(graph(mx.array([draft]), cache=graph_cache))
    assert counting.calls == 1
    theirs = np.array(plain(mx.array([draft]), cache=plain_cache))
    assert ours.shape == theirs.shape == (1, len(draft), theirs.shape[-1])
    for row_ours, row_theirs in zip(ours[0], theirs[0], strict=True):
        assert_within_product_rounding(row_ours, row_theirs)
        assert int(np.argmax(row_ours)) == int(np.argmax(row_theirs))
    for a, b in zip(graph_cache, plain_cache, strict=True):
        assert a.offset == b.offset == len(PROMPT) + len(draft)
        assert a.keys is not None
        assert b.keys is not None
        assert_within_product_rounding(np.array(a.keys[..., : a.offset, :]), np.array(b.keys[..., : b.offset, :]))
    # A rejected tail is trimmed as after mlx-lm's pass, and the next step sees what it left.
    trim_prompt_cache(graph_cache, 3)
    trim_prompt_cache(plain_cache, 3)
    _, graph_tokens = _decode(graph, graph_cache, draft[2], steps=4)
    _, plain_tokens = _decode(plain, plain_cache, draft[2], steps=4)
    assert graph_tokens == plain_tokens


def _scripted(model: nn.Module, first: int, tokens: Sequence[int] | None) -> tuple[list[np.ndarray], list[int]]:
    """A session past a step graph's reuse boundaries: the prompt prefilled (buffers of 256 positions), steps to 130
    held, a 17-token pass between steps (a layer pass, through the other allocator), a few steps, 4 of them trimmed
    (a rejected draft), then steps on past 256 held (mlx grows the buffers). Greedy where `tokens` is None, else fed
    `tokens` (another run's choices, in the order fed): every step's last logits and the tokens fed."""
    cache, token = _prefilled(model, PROMPT)
    assert token == first
    fed: list[int] = []
    outputs: list[np.ndarray] = []

    def feed(rows: list[int]) -> None:
        logits = model(mx.array([rows]), cache=cache)
        mx.eval(logits)
        outputs.append(np.array(logits[0, -1]))
        fed.extend(rows)

    def chosen(rows: list[int]) -> list[int]:
        return rows if tokens is None else list(tokens[len(fed) : len(fed) + len(rows)])

    def next_token() -> list[int]:
        return chosen([int(np.argmax(outputs[-1])) if outputs else first])

    for _ in range(90):
        feed(next_token())
    feed(chosen([*PROMPT[:16], *next_token()]))
    for _ in range(5):
        feed(next_token())
    assert trim_prompt_cache(cast(list[object], cache), 4) == 4
    for _ in range(200):
        feed(next_token())
    assert cache[0].offset == len(PROMPT) + len(fed) - 4 == 40 + 90 + 17 + 1 + 200
    return outputs, fed


@pytest.mark.usefixtures("ggml")
@pytest.mark.parametrize("name", ["tiny-qwen-tools", "tiny-llama31-tools"])
def test_a_step_graph_is_kept_for_the_next_steps_and_reads_only_what_the_cache_holds(
    name: FixtureModelName, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Steps run one kept graph until its views' span ends or mlx moves the buffers. Across a layer pass, a trim
    (its dropped positions masked, as the zeros past what is held) and the buffers' growth, each step's logits are
    those of a graph built for that step alone over exactly the positions held (masking nothing), and within the
    products' rounding of the model with the graph off fed the same tokens.

    "Those of" is bit for bit at almost every step, not every one: attention over a masked span and over exactly the
    held positions can differ in a last bit (with only the k and v products through exo's kernel, their layer-1
    inputs differed at 18 of 1,180 products), which the next product's quantized input absorbs unless a value sits
    on a rounding boundary; then one quantized value moves a step and the logits by a fraction of a percent (3 of
    296 steps with exo's one-row products, none with ggml's). A stale view or a wrong position moves every step
    after it, and by far more."""
    graph, plain = graph_and_plain(name, "gguf", monkeypatch, tmp_path, off=(DECODE_GRAPH_VARIABLE,))
    step = decode_graph_of(graph)
    assert step is not None
    built = _CountedBuilds(step, monkeypatch)
    _, first = _prefilled(plain, PROMPT)
    kept, fed = _scripted(graph, first, None)
    assert len(kept) == 90 + 1 + 5 + 200
    # 344 positions held at the end: a graph every SPAN_STEP positions, one more where the buffers grew at 256, and
    # one more after each outside use of the buffers (the prefill, the layer pass, the growth): its step appends
    # through mlx, the next writes into the buffers the cache then owns (`owned_kv_cache.py`).
    assert 300 // SPAN_STEP <= built.builds <= 344 // SPAN_STEP + 2 + 3

    def held_exactly(sequences: decode_graph.Sequences, *, capacity: int) -> int:
        assert capacity >= sequences.end
        return sequences.end

    with monkeypatch.context() as exact:
        exact.setattr(decode_graph, "_span_end", held_exactly)
        exact.setattr(decode_graph._StepGraph, "serves", lambda *_: False)  # pyright: ignore[reportPrivateUsage]
        alone, _ = _scripted(graph, first, fed)
    apart = 0
    for a, b in zip(kept, alone, strict=True):
        if not np.array_equal(a, b):
            apart += 1
            assert int(np.argmax(a)) == int(np.argmax(b))
            assert float(np.abs(a - b).max()) < 1e-2 * float(np.abs(b).max())
    assert apart <= len(kept) // 20
    theirs, _ = _scripted(plain, first, fed)
    for a, b in zip(kept[:100], theirs[:100], strict=True):
        assert_within_product_rounding(a, b)


@pytest.mark.usefixtures("ggml")
def test_the_graphs_compute_is_the_devices_work_on_the_step_clock(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The host-overhead meter: the forward pass the graph computes in its call (synchronously, on ggml's threads) is
    the model's work, "device" on the step clock, not the host's part around the call; mlx-lm's model (the graph off)
    only builds its step in the call, so nothing of that call is the device's."""
    graph, plain = graph_and_plain("tiny-qwen-tools", "q8_0", monkeypatch, tmp_path, off=(DECODE_GRAPH_VARIABLE,))
    measured: list[dict[StepPart, float]] = []
    for model in (graph, plain):
        cache, first = _prefilled(model, PROMPT)
        STEP_CLOCK.begin()
        for _ in range(3):
            with STEP_CLOCK.part("graph"):
                model(mx.array([[first]]), cache=cache)
        measured.append(STEP_CLOCK.end()[1])
    assert measured[0].get("device", 0.0) > 0
    assert "device" not in measured[1]
    assert measured[1]["graph"] > 0
