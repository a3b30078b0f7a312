"""A SwiGLU MLP's three ggml matrices computed as one ggml graph in decode steps (`q8_layers.SwiGluMlp`,
`ggml_library.GgmlSwiGluMlp`, issue 33): the graph computes down · (silu(x · gateᵀ) ⊙ (x · upᵀ)) as the separate
products and mlx's swiglu do, within float32 rounding of the gating; qwen2 and llama fixture models have every MLP
fused, decode through the fused graph, give the same greedy tokens and near-equal logits fused and unfused, and
compute prefill exactly as before.

These tests need ggml's CPU library (`uv run exo ggml build`, or EXO_GGML_DIR): without it they skip for a reason of
the machine, a failure under EXO_STRICT_SKIPS=1.
"""

import sys
from collections.abc import Callable
from typing import cast

import mlx.core as mx
import numpy as np
import pytest
from mlx import nn
from mlx_lm.models.cache import make_prompt_cache

from exo.worker.engines.mlx.cpu import kernels
from exo.worker.engines.mlx.cpu.engine import DECODE_GRAPH_VARIABLE, LAYER_GRAPH_VARIABLE
from exo.worker.engines.mlx.cpu.ggml_library import CACHED_ROWS, Ggml, GgmlMatrix, GgmlSwiGluMlp
from exo.worker.engines.mlx.cpu.kernels import swiglu as numpy_swiglu
from exo.worker.engines.mlx.cpu.q8_layers import SwiGluMlp, fuse_swiglu_mlps
from tests.fixtures.fixture_specs import FixtureModelName
from tests.worker.engines.mlx.cpu.weight_formats import loaded_fixture

WIDTH, HIDDEN = 128, 96


def _matrix(ggml: Ggml, type_name: str, weights: np.ndarray) -> GgmlMatrix:
    matrix = GgmlMatrix(ggml, type_name, weights.shape[0], weights.shape[1])
    matrix.fill(0, weights.astype(np.float32))
    return matrix


def _mlp_matrices(ggml: Ggml) -> tuple[GgmlMatrix, GgmlMatrix, GgmlMatrix]:
    """gate and up (HIDDEN × WIDTH) and down (WIDTH × HIDDEN), in three block types."""
    generator = np.random.default_rng(5)
    return (
        _matrix(ggml, "Q8_0", generator.normal(size=(HIDDEN, WIDTH)) / 8),
        _matrix(ggml, "Q5_0", generator.normal(size=(HIDDEN, WIDTH)) / 8),
        _matrix(ggml, "Q4_0", generator.normal(size=(WIDTH, HIDDEN)) / 8),
    )


@pytest.mark.parametrize("rows", [1, 2, 5, 8, CACHED_ROWS + 1])
def test_the_fused_graph_is_the_mlp_of_the_separate_products(ggml: Ggml, rows: int) -> None:
    gate, up, down = _mlp_matrices(ggml)
    mlp = GgmlSwiGluMlp(gate, up, down)
    pool = ggml.shared_threadpool(2, 0)
    for seed in (rows, rows + 100):  # a kept graph run again on other values
        x = np.random.default_rng(seed).normal(size=(rows, WIDTH)).astype(np.float32)
        fused = mlp.product(x, 2, pool)
        gated = np.asarray(nn.silu(mx.array(gate.product(x, 2, pool)))) * up.product(x, 2, pool)
        separate = down.product(np.ascontiguousarray(gated, dtype=np.float32), 2, pool)
        assert fused.shape == (rows, WIDTH)
        # The gating differs from mlx's silu by float32 rounding; down re-quantizes its input to Q8_0 blocks, where
        # such a difference can move a value by one step: far below the products' own quantization error.
        scale = float(np.abs(separate).max())
        assert scale > 0.1
        assert float(np.abs(fused - separate).max()) < 2e-2 * scale
    assert mlp.kept_row_counts == ([rows] if rows <= CACHED_ROWS else [])


def test_an_mlp_refuses_matrices_that_do_not_chain(ggml: Ggml) -> None:
    gate, up, down = _mlp_matrices(ggml)
    with pytest.raises(ValueError, match="not one MLP"):
        GgmlSwiGluMlp(gate, down, up)
    with pytest.raises(ValueError, match="not one MLP"):
        GgmlSwiGluMlp(gate, up, gate)


def _logits(model: nn.Module, prompt: list[int], steps: int) -> tuple[list[np.ndarray], list[int]]:
    """Prefill logits then `steps` greedy one-row decode steps' logits, and the greedy tokens."""
    cache = make_prompt_cache(model)
    tokens = mx.array([prompt])
    outputs: list[np.ndarray] = []
    chosen: list[int] = []
    for _ in range(steps + 1):
        logits = model(tokens, cache=cache)
        mx.eval(logits)
        outputs.append(np.array(logits))
        tokens = logits[:, -1].argmax(-1)[:, None]
        chosen.append(int(tokens.item()))
    return outputs, chosen


class _SeparateMlp(nn.Module):
    """The MLP as mlx-lm's own class computes it, from the same three layers: the products apart, and the SwiGLU its
    model module calls (the numpy one where the engine re-pointed mlx-lm's modules to it, as it does on load)."""

    def __init__(self, mlp: SwiGluMlp, model_module: str) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        self.model_module = model_module

    def __call__(self, x: mx.array) -> mx.array:
        swiglu = cast(Callable[[mx.array, mx.array], mx.array], vars(sys.modules[self.model_module])["swiglu"])
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))


@pytest.mark.usefixtures("ggml")
@pytest.mark.parametrize("name", ["tiny-qwen-tools", "tiny-llama31-tools"])
def test_a_fixture_models_mlps_are_fused_in_decode_and_unchanged_in_prefill(
    name: FixtureModelName, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DECODE_GRAPH_VARIABLE, "off")  # decode steps inside mlx-lm's model, as over a few rows
    monkeypatch.setenv(LAYER_GRAPH_VARIABLE, "off")  # and prefill
    model = loaded_fixture(name, "q8_0").model
    mlps = [module for _, module in model.named_modules() if isinstance(module, SwiGluMlp)]
    assert len(mlps) == len(cast(list[nn.Module], model["model"]["layers"]))
    assert fuse_swiglu_mlps(model) == 0  # already fused: nothing left to replace
    prompt = [(index * 13) % 200 + 5 for index in range(40)]  # 40 rows: prefill takes the separate products
    fused_logits, fused_tokens = _logits(model, prompt, steps=6)
    assert all(mlp.graph.kept_row_counts == [1] for mlp in mlps)  # each decode step's MLP ran as one graph
    layers = cast(list[nn.Module], model["model"]["layers"])
    model_module = type(model).__module__  # mlx_lm.models.qwen2 / .llama, whose MLP class was replaced
    assert vars(sys.modules[model_module])["swiglu"] is numpy_swiglu  # the engine's load turned the numpy one on
    for layer in layers:  # the MLPs as before the fusion, built here: the product code has no switch for it
        layer.mlp = _SeparateMlp(cast(SwiGluMlp, layer["mlp"]), model_module)
    apart_logits, apart_tokens = _logits(model, prompt, steps=6)
    np.testing.assert_array_equal(fused_logits[0], apart_logits[0])  # prefill: the same computation
    assert fused_tokens == apart_tokens
    for fused, apart in zip(fused_logits[1:], apart_logits[1:], strict=True):
        assert float(np.abs(fused - apart).max()) < 5e-2 * float(np.abs(apart).max())


class _RecordingLayer(nn.Module):
    """A layer that keeps what it is given, then multiplies it as the real one."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer
        self.inputs: list[mx.array] = []

    def __call__(self, x: mx.array) -> mx.array:
        self.inputs.append(x)
        return self.layer(x)


@pytest.mark.usefixtures("ggml")
def test_prefill_feeds_down_proj_the_swiglu_of_mlx_lms_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    # The engine points mlx-lm's modules at the numpy SwiGLU (faster on long prefill chunks; this small model's reach
    # its threshold only when lowered here). A fused MLP's prefill must use it too, not the mlx one it was written
    # with, which rounds differently (the products after it quantize their input to Q8_0, which hides that in logits).
    monkeypatch.setattr(kernels, "MIN_GATE_VALUES", 1)
    model = loaded_fixture("tiny-qwen-tools", "q8_0").model
    mlp = cast(SwiGluMlp, cast(list[nn.Module], model["model"]["layers"])[0]["mlp"])
    down = mlp.down_proj
    recording = _RecordingLayer(down)
    x = mx.random.normal((1, CACHED_ROWS + 24, down.q8.shape[0]), key=mx.random.key(3))
    try:
        mlp.down_proj = recording  # pyright: ignore[reportAttributeAccessIssue]
        mx.eval(mlp(x))
    finally:
        mlp.down_proj = down
    gate, up = mlp.gate_proj(x), mlp.up_proj(x)
    expected = numpy_swiglu(gate, up)
    assert not mx.array_equal(expected, kernels.MLX_SWIGLU(gate, up)).item()  # the two round apart on this input
    (fed,) = recording.inputs
    assert mx.array_equal(fed, expected).item()
