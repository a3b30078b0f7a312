"""A decoder layer's pass over several tokens as one ggml graph (`layer_graph.py`, issue 33): installed where the CPU
engine holds a qwen2 or llama model's matrices in ggml, a prompt prefilled through it (cold or on top of a cache,
alone or as a left-padded batch, paused between layers) leaves the logits
and the KV cache mlx-lm's layers leave, within the products' quantization error, and the greedy tokens after it are
the same; a call it does not compute exactly is the layer's own.

These tests need ggml's CPU library (`uv run exo ggml build`, or EXO_GGML_DIR): without it they skip for a reason of
the machine, a failure under EXO_STRICT_SKIPS=1.
"""

from pathlib import Path
from typing import cast

import mlx.core as mx
import numpy as np
import pytest
from mlx import nn
from mlx_lm.models.cache import BatchKVCache, KVCache, RotatingKVCache, make_prompt_cache

from exo.shared.types.cpu_kernels import CpuWeightsSetting
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.cpu import layer_graph
from exo.worker.engines.mlx.cpu.decode_graph import decode_graph_of
from exo.worker.engines.mlx.cpu.engine import DECODE_GRAPH_VARIABLE, LAYER_GRAPH_VARIABLE, CpuKernels
from exo.worker.engines.mlx.cpu.layer_graph import LayerPass
from exo.worker.engines.mlx.generator.layer_steps import SteppedPass, install_layer_steps
from exo.worker.engines.mlx.model_loader import load_model as exo_load_model
from exo.worker.runner.idle_turns import release_freed_memory
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR, FixtureModelName
from tests.worker.engines.mlx.cpu.gguf_export import export_fixture
from tests.worker.engines.mlx.cpu.weight_formats import (
    assert_within_product_rounding,
    graph_and_plain,
    loaded_fixture,
    mismatched_trained_cases,
)

PROMPT = [(index * 13) % 200 + 5 for index in range(40)]


class _Counting:
    """Counts the layer passes the graph computed (not those it left to the layer)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.computed = 0
        original = LayerPass.__call__

        def counted(pass_: LayerPass, x: mx.array, mask: object, cache: object) -> mx.array | None:
            out = original(pass_, x, mask, cache)
            self.computed += out is not None
            return out

        monkeypatch.setattr(LayerPass, "__call__", counted)


def _layers(model: nn.Module) -> list[nn.Module]:
    return cast(list[nn.Module], model["model"]["layers"])


def _pieces(model: nn.Module, prompt: list[int], cuts: list[int]) -> tuple[list[KVCache], np.ndarray]:
    """`prompt` prefilled in pieces ending at `cuts` (then the rest): the caches and the last piece's logits."""
    cache = cast(list[KVCache], make_prompt_cache(model))
    logits = mx.zeros((0,))
    for start, end in zip([0, *cuts], [*cuts, len(prompt)], strict=True):
        logits = model(mx.array([prompt[start:end]]), cache=cache)
        mx.eval(logits)
    return cache, np.array(logits[0])


def _greedy(model: nn.Module, cache: list[KVCache], first: int, steps: int) -> list[int]:
    tokens = [first]
    for _ in range(steps):
        logits = model(mx.array([[tokens[-1]]]), cache=cache)
        tokens.append(int(np.argmax(np.array(logits[0, -1]))))
    return tokens


@pytest.mark.usefixtures("ggml")
@pytest.mark.parametrize("weights", ["q8_0", "gguf"])
@pytest.mark.parametrize("name", ["tiny-qwen-tools", "tiny-llama31-tools"])
def test_a_prompt_prefills_a_graph_a_layer_as_mlx_lms_layers_do(
    name: FixtureModelName, weights: CpuWeightsSetting, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    graph, plain = graph_and_plain(
        name, weights, monkeypatch, tmp_path, off=(DECODE_GRAPH_VARIABLE, LAYER_GRAPH_VARIABLE)
    )
    counting = _Counting(monkeypatch)
    ours, our_logits = _pieces(graph, PROMPT, cuts=[20])  # a cold piece, then one on top of the cache
    assert counting.computed == 2 * len(_layers(graph))
    counting.computed = 0
    theirs, their_logits = _pieces(plain, PROMPT, cuts=[20])
    assert counting.computed == 0
    for row_ours, row_theirs in zip(our_logits, their_logits, strict=True):
        assert_within_product_rounding(row_ours, row_theirs)
    for layer_ours, layer_theirs in zip(ours, theirs, strict=True):
        assert layer_ours.offset == layer_theirs.offset == len(PROMPT)
        for a, b in ((layer_ours.keys, layer_theirs.keys), (layer_ours.values, layer_theirs.values)):
            assert a is not None
            assert b is not None
            assert_within_product_rounding(np.array(a[..., : len(PROMPT), :]), np.array(b[..., : len(PROMPT), :]))
    first = int(np.argmax(our_logits[-1]))
    assert first == int(np.argmax(their_logits[-1]))
    assert _greedy(graph, ours, first, steps=6) == _greedy(plain, theirs, first, steps=6)


@pytest.mark.usefixtures("ggml")
def test_what_the_graph_keeps_between_passes_is_released_when_idle_and_made_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The layer passes' buffer and the kept step graphs go when the runner turns idle; the next prompt's passes and
    steps make them again and compute what they computed before."""
    graph, _ = graph_and_plain("tiny-qwen-tools", "gguf", monkeypatch, tmp_path, off=())
    step = decode_graph_of(graph)
    assert step is not None
    counting = _Counting(monkeypatch)
    assert (step.pass_buffer_bytes, step.kept_steps) == (0, 0)
    cache, before = _pieces(graph, PROMPT, cuts=[20])
    tokens_before = _greedy(graph, cache, int(np.argmax(before[-1])), steps=4)
    assert counting.computed == 2 * len(_layers(graph))
    assert step.pass_buffer_bytes > 0
    assert step.kept_steps > 0
    release_freed_memory()  # what the serving loop calls as it turns idle
    assert (step.pass_buffer_bytes, step.kept_steps) == (0, 0)
    cache, after = _pieces(graph, PROMPT, cuts=[20])
    assert counting.computed == 4 * len(_layers(graph))
    assert step.pass_buffer_bytes > 0
    np.testing.assert_array_equal(after, before)
    assert _greedy(graph, cache, int(np.argmax(after[-1])), steps=4) == tokens_before
    assert step.kept_steps > 0


def _batch_prefill(model: nn.Module, prompts: list[list[int]]) -> np.ndarray:
    """The prompts prefilled as one left-padded batch (as the group prefill merges them): the last position's
    logits of each."""
    longest = max(len(prompt) for prompt in prompts)
    padding = [longest - len(prompt) for prompt in prompts]
    cache = [BatchKVCache(left_padding=padding) for _ in _layers(model)]
    half = longest // 2
    rows = mx.array([[0] * pad + prompt for pad, prompt in zip(padding, prompts, strict=True)])
    mx.eval(model(rows[:, :half], cache=cache))  # a first piece, then one over cached (padded) positions
    logits = model(rows[:, half:], cache=cache)
    mx.eval(logits)
    return np.array(logits[:, -1])


@pytest.mark.usefixtures("ggml")
@pytest.mark.parametrize("name", ["tiny-qwen-tools", "tiny-llama31-tools"])
def test_a_left_padded_batch_prefills_as_mlx_lms_layers_do(
    name: FixtureModelName, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    graph, plain = graph_and_plain(
        name, "q8_0", monkeypatch, tmp_path, off=(DECODE_GRAPH_VARIABLE, LAYER_GRAPH_VARIABLE)
    )
    counting = _Counting(monkeypatch)
    prompts = [PROMPT, PROMPT[:17], [9, 8, 7, *PROMPT[5:30]]]  # left padding 0, 23 and 12
    ours = _batch_prefill(graph, prompts)
    assert counting.computed == 2 * len(_layers(graph))
    theirs = _batch_prefill(plain, prompts)
    for prompt, row_ours, row_theirs in zip(prompts, ours, theirs, strict=True):
        assert_within_product_rounding(row_ours, row_theirs)
        # Each sequence's next token is the one it gets prefilled alone.
        _, alone = _pieces(graph, prompt, cuts=[])
        assert int(np.argmax(row_ours)) == int(np.argmax(alone[-1]))


@pytest.mark.usefixtures("ggml")
def test_a_pass_paused_between_layers_is_the_same_pass() -> None:
    model = loaded_fixture("tiny-qwen-tools", "q8_0").model
    assert install_layer_steps(model) == len(_layers(model))
    whole_cache, _ = _pieces(model, PROMPT[:30], cuts=[])
    cache = make_prompt_cache(model)
    tokens = mx.array([PROMPT[:30]])
    stepped = SteppedPass(lambda: mx.eval(model(tokens, cache=cache), *[layer.state for layer in cache]))
    advances = 0
    while not stepped.advance(0.0):  # a zero time slice: a pause at every layer
        advances += 1
    assert advances == len(_layers(model)) - 1
    for a, b in zip(cast(list[KVCache], cache), whole_cache, strict=True):
        np.testing.assert_array_equal(np.array(a.keys), np.array(b.keys))
        np.testing.assert_array_equal(np.array(a.values), np.array(b.values))


@pytest.mark.usefixtures("ggml")
def test_calls_the_graph_does_not_compute_are_the_layers_own(monkeypatch: pytest.MonkeyPatch) -> None:
    model = loaded_fixture("tiny-qwen-tools", "q8_0").model
    step = decode_graph_of(model)
    assert step is not None
    layer = _layers(model)[0]
    hidden = int(layer["input_layernorm"].weight.shape[0])
    x = mx.array(np.random.default_rng(0).normal(size=(1, 6, hidden)).astype(np.float32))
    pass_ = LayerPass(step, 0)
    additive = mx.zeros((6, 6))  # a float mask: mlx-lm's models pass booleans or "causal"
    rotating = RotatingKVCache(max_size=64)
    for mask, cache, inputs in (
        (additive, KVCache(), x),
        ("causal", rotating, x),
        ("causal", KVCache(), x.astype(mx.float16)),
        ("window", KVCache(), x),
    ):
        assert pass_(inputs, mask, cache) is None
        assert cache.offset == 0  # nothing appended
    counting = _Counting(monkeypatch)
    out = layer(x, additive, KVCache())  # the layer's own path
    assert counting.computed == 0
    assert out.shape == x.shape


@pytest.mark.usefixtures("ggml")
def test_fixture_models_keep_their_trained_answers_through_gguf_layer_passes(tmp_path: Path) -> None:
    source = export_fixture("tiny-qwen-tools", tmp_path / "tiny-qwen-tools")
    assert mismatched_trained_cases("tiny-qwen-tools", "gguf", source) == []


def _report(monkeypatch: pytest.MonkeyPatch, **variables: str) -> tuple[nn.Module, str]:
    for variable, value in variables.items():
        monkeypatch.setenv(variable, value)
    kernels = CpuKernels("auto", weights="q8_0")
    model = exo_load_model(FIXTURE_MODELS_DIR / "tiny-qwen-tools", ShardAssignment(), cpu_kernels=kernels).model
    for variable in variables:
        monkeypatch.delenv(variable)
    return model, kernels.report().describe()


def _passes_installed(model: nn.Module) -> bool:
    return all(isinstance(layer, layer_graph._LayerGraphCall) for layer in _layers(model))  # pyright: ignore[reportPrivateUsage]


@pytest.mark.usefixtures("ggml")
def test_the_report_says_whether_layer_passes_are_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    model, line = _report(monkeypatch)
    assert _passes_installed(model)
    assert "prefill and verification passes as one ggml graph a layer" in line.split("; off:")[0]
    model, line = _report(monkeypatch, **{LAYER_GRAPH_VARIABLE: "off"})
    assert not _passes_installed(model)
    assert decode_graph_of(model) is not None  # the decode step's graph stays
    assert f"prefill and verification passes as one ggml graph a layer ({LAYER_GRAPH_VARIABLE}=off)" in line
    model, line = _report(monkeypatch, **{DECODE_GRAPH_VARIABLE: "off"})
    assert _passes_installed(model)
    assert decode_graph_of(model) is None
