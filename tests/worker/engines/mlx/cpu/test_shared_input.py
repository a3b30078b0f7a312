"""Sibling layers that multiply one input (q/k/v, gate/up) computed as one ggml graph (`shared_input.py`, issue 33):
each grouped product is bitwise the product its matrix computes alone (the same kernel over the same rows, for any
block type), a converted fixture model computes the same logits grouped and ungrouped, and a sibling called with
another input never receives a product of the previous one.

These tests need ggml's CPU library (`uv run exo ggml build`, or EXO_GGML_DIR): without it they skip for a reason of
the machine, a failure under EXO_STRICT_SKIPS=1.
"""

from typing import cast

import mlx.core as mx
import numpy as np
import pytest
from mlx import nn

from exo.worker.engines.mlx.cpu.ggml_library import CACHED_ROWS, Ggml, GgmlMatrix, GgmlProducts
from exo.worker.engines.mlx.cpu.q8_layers import Q8Linear, quantize_model_q8, share_sibling_inputs
from tests.fixtures.fixture_specs import FixtureModelName
from tests.worker.engines.mlx.cpu.weight_formats import fixture_matrix, greedy_step_logits, loaded_fixture

WIDTH = 128
"""The width of `fixture_matrix()` (its rows are 128 values)."""
ROW_COUNTS = [1, 2, 5, 8, CACHED_ROWS + 1, 300]
"""A decode step, batched decoding (kept graphs), and prefill chunks (a graph built per call)."""


def _matrix(ggml: Ggml, type_name: str, weights: np.ndarray) -> GgmlMatrix:
    matrix = GgmlMatrix(ggml, type_name, weights.shape[0], weights.shape[1])
    matrix.fill(0, weights.astype(np.float32))
    return matrix


def _siblings(ggml: Ggml) -> list[GgmlMatrix]:
    """A q/k/v-shaped trio of one width: the fixture's trained matrix in Q8_0, and Gaussian ones in Q5_0 and Q4_0
    (a group is generic over its matrices' block types)."""
    trained = np.asarray(fixture_matrix())
    assert trained.shape[1] == WIDTH
    generator = np.random.default_rng(3)
    return [
        _matrix(ggml, "Q8_0", trained),
        _matrix(ggml, "Q5_0", generator.normal(size=(32, WIDTH))),
        _matrix(ggml, "Q4_0", generator.normal(size=(96, WIDTH))),
    ]


@pytest.mark.parametrize("rows", ROW_COUNTS)
def test_grouped_products_are_bitwise_the_separate_products(ggml: Ggml, rows: int) -> None:
    matrices = _siblings(ggml)
    group = GgmlProducts(matrices)
    x = np.random.default_rng(rows).normal(size=(rows, WIDTH)).astype(np.float32)
    pool = ggml.shared_threadpool(2, 0)
    grouped = group.products(x, 2, pool)
    assert [result.shape for result in grouped] == [(rows, matrix.shape[0]) for matrix in matrices]
    for result, matrix in zip(grouped, matrices, strict=True):
        np.testing.assert_array_equal(result, matrix.product(x, 2, pool))
    # A kept graph run again on other values gives their products, not the previous ones.
    other = x[::-1].copy()
    for result, matrix in zip(group.products(other, 2, pool), matrices, strict=True):
        np.testing.assert_array_equal(result, matrix.product(other, 2, pool))


def test_a_group_refuses_matrices_of_different_widths(ggml: Ggml) -> None:
    wide = _matrix(ggml, "Q8_0", np.ones((32, WIDTH)))
    narrow = _matrix(ggml, "Q8_0", np.ones((32, WIDTH // 2)))
    with pytest.raises(ValueError, match="widths"):
        GgmlProducts([wide, narrow])
    with pytest.raises(ValueError, match="width"):
        GgmlProducts([wide]).products(np.ones((1, WIDTH // 2), dtype=np.float32), 1, ggml.shared_threadpool(1, 0))


class _Attention(nn.Module):
    """The call pattern of mlx-lm's Attention: q, k and v projections of the same input, then o of another."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.q_proj = nn.Linear(width, width, bias=True)
        self.k_proj = nn.Linear(width, 32, bias=True)
        self.v_proj = nn.Linear(width, 32, bias=True)
        self.o_proj = nn.Linear(width, width, bias=False)


def _converted_attention(ggml: Ggml) -> _Attention:
    mx.random.seed(7)
    attention = _Attention(WIDTH)
    assert quantize_model_q8(attention, ggml) == 4
    return attention


def _layer(module: nn.Module, name: str) -> Q8Linear:
    layer = module[name]
    assert isinstance(layer, Q8Linear)
    return layer


def test_q_k_v_are_grouped_and_o_is_not(ggml: Ggml) -> None:
    attention = _converted_attention(ggml)
    shared = [_layer(attention, name).shared for name in ("q_proj", "k_proj", "v_proj")]
    assert all(entry is not None for entry in shared)
    assert len({id(cast(object, entry.group)) for entry in shared if entry is not None}) == 1
    assert _layer(attention, "o_proj").shared is None
    # A model without the pattern keeps one graph a product.
    plain = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH))
    assert quantize_model_q8(plain, ggml) == 2
    assert share_sibling_inputs(plain) == 0
    assert all(isinstance(layer, Q8Linear) and layer.shared is None for layer in plain.layers)


def _separate(layer: Q8Linear, x: mx.array) -> mx.array:
    shared, layer.shared = layer.shared, None
    try:
        return layer(x)
    finally:
        layer.shared = shared


def test_a_sibling_called_with_another_input_computes_it_afresh(ggml: Ggml) -> None:
    """The stale cases: k called with a new input after q computed the group for an old one; q called twice with the
    same input; an input equal in value but another array; siblings called out of order."""
    attention = _converted_attention(ggml)
    q, k, v = (_layer(attention, name) for name in ("q_proj", "k_proj", "v_proj"))
    first = mx.random.normal((1, 1, WIDTH), key=mx.random.key(1))
    second = mx.random.normal((1, 1, WIDTH), key=mx.random.key(2))
    q(first)  # computes q, k and v of `first`; k's and v's wait
    assert mx.array_equal(k(second), _separate(k, second)).item()
    assert not mx.array_equal(_separate(k, first), _separate(k, second)).item()
    assert mx.array_equal(q(second), _separate(q, second)).item()
    assert mx.array_equal(q(second), _separate(q, second)).item()  # q again: not a result already taken
    copy = mx.array(np.asarray(second))
    assert mx.array_equal(v(copy), _separate(v, copy)).item()
    assert mx.array_equal(v(first), _separate(v, first)).item()
    assert mx.array_equal(k(first), _separate(k, first)).item()  # after v, out of order


def _logits(model: nn.Module, prompt: list[int], steps: int) -> list[np.ndarray]:
    """Prefill logits then `steps` greedy decode steps' logits, over two sequences at once."""
    return greedy_step_logits(model, mx.array([prompt, prompt[::-1]]), steps)


@pytest.mark.usefixtures("ggml")
@pytest.mark.parametrize("name", ["tiny-qwen-tools", "tiny-llama31-tools"])
def test_a_fixture_models_logits_are_the_same_grouped_and_ungrouped(name: FixtureModelName) -> None:
    """qwen2 and llama: every layer's q/k/v and gate/up are grouped, and the logits are bitwise those of one graph a
    product, in prefill and in decode steps."""
    model = loaded_fixture(name, "q8_0").model
    layers = [module for _, module in model.named_modules() if isinstance(module, Q8Linear)]
    grouped = [layer for layer in layers if layer.shared is not None]
    blocks = len(cast(list[nn.Module], model["model"]["layers"]))
    assert len(grouped) == 5 * blocks
    prompt = [(index * 11) % 200 + 3 for index in range(40)]
    together = _logits(model, prompt, steps=4)
    shared = [(layer, layer.shared) for layer in grouped]
    for layer in grouped:
        layer.shared = None
    apart = _logits(model, prompt, steps=4)
    for layer, entry in shared:
        layer.shared = entry
    for one, other in zip(together, apart, strict=True):
        np.testing.assert_array_equal(one, other)
