"""Prefill products on dequantized slices (`dequant_gemm.py`) and the skipped output head of a prefill piece
(`discarded_logits.logits_discarded`).

Tolerances: ggml's `to_float` writes exactly the values gguf's numpy dequantizer computes (scale × value in float32,
compared within 1e-6 relative); the dequantized GEMM is the float32 product of those values, so it agrees with a
float64 product of the same matrix within 1e-5 of the output's largest magnitude (float32 rounding over 512-value
sums), far inside the 0.4-0.8 % by which ggml's own kernels differ from it (their activations rounded to 8 bits):
a result within 1e-5 came from the dequantized path, one off by ~0.5 % from ggml's kernels.

These tests need ggml's CPU library (`uv run exo ggml build`, or EXO_GGML_DIR): without it they skip for a reason of
the machine, a failure under EXO_STRICT_SKIPS=1.
"""

from typing import cast

import gguf
import mlx.core as mx
import numpy as np
import numpy.typing as npt
import pytest
from gguf import GGMLQuantizationType
from mlx import nn
from mlx_lm.models.cache import make_prompt_cache

from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.cpu import dequant_gemm
from exo.worker.engines.mlx.cpu.dequant_gemm import (
    PREFILL_ROWS,
    DequantizedGemm,
    MklSgemm,
    takes_dequantized,
)
from exo.worker.engines.mlx.cpu.engine import CpuKernels
from exo.worker.engines.mlx.cpu.ggml_library import Ggml, GgmlMatrix, GgmlProducts
from exo.worker.engines.mlx.cpu.q8_layers import (
    Q8Embedding,
    Q8Linear,
    Q8Weights,
    ggml_threads,
    mark_output_head,
)
from exo.worker.engines.mlx.cpu.shared_input import SharedInputProducts
from exo.worker.engines.mlx.discarded_logits import logits_discarded
from exo.worker.engines.mlx.model_loader import load_model as exo_load_model
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR
from tests.worker.engines.mlx.cpu.platform_gate import require_linux_cpu
from tests.worker.engines.mlx.cpu.weight_formats import fixture_matrix

TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
"""Every type the gguf layers serve (ggml_library.GGML_TYPES)."""
EXACT = 1e-5
"""The dequantized GEMM against a float64 product of the same dequantized matrix."""
KERNELS = 0.02
"""ggml's kernels against the float product (as test_gguf_layers)."""


def _weight() -> npt.NDArray[np.float32]:
    """A real trained matrix (64 × 256) beside itself reversed: 64 × 512, whole blocks of every type."""
    trained = np.asarray(fixture_matrix())
    return np.ascontiguousarray(np.concatenate([trained, trained[:, ::-1]], axis=1), dtype=np.float32)


def _matrix(ggml: Ggml, type_name: str, weight: npt.NDArray[np.float32]) -> GgmlMatrix:
    matrix = GgmlMatrix(ggml, type_name, weight.shape[0], weight.shape[1])
    matrix.fill(0, weight)
    return matrix


def _dequantized(matrix: GgmlMatrix) -> npt.NDArray[np.float32]:
    """The matrix as gguf's numpy dequantizer reads its blocks (the reference for ggml's `to_float`)."""
    values = gguf.quants.dequantize(matrix.blocks.copy(), GGMLQuantizationType[matrix.type_name])
    return np.asarray(values, dtype=np.float32).reshape(matrix.shape)


def _relative(result: npt.NDArray[np.float32], reference: npt.NDArray[np.float64]) -> float:
    return float(np.abs(result - reference).max() / np.abs(reference).max())


@pytest.mark.parametrize("type_name", TYPES)
def test_ggml_dequantizes_each_type_to_the_values_its_blocks_hold(ggml: Ggml, type_name: str) -> None:
    matrix = _matrix(ggml, type_name, _weight())
    reference = _dequantized(matrix)
    whole = np.empty(matrix.shape, dtype=np.float32)
    matrix.dequantize(0, matrix.shape[0], whole)
    np.testing.assert_allclose(whole, reference, rtol=1e-6, atol=0)
    rows = np.full((5, matrix.shape[1]), np.nan, dtype=np.float32)
    matrix.dequantize(7, 12, rows)  # a slice of rows lands at the start of the destination
    np.testing.assert_allclose(rows, reference[7:12], rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match="do not fit"):
        matrix.dequantize(60, 70, rows)


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("rows", [PREFILL_ROWS, 300, 512])
def test_the_dequantized_gemm_is_the_float_product_of_the_dequantized_matrix(
    ggml: Ggml, type_name: str, rows: int
) -> None:
    """MKL's sgemm and numpy's, on one and two threads, the buffer a whole matrix or slices of 13 rows (the last one
    short): each product within 1e-5 of the float64 product, and within ggml's kernels' 2 % of ggml's own."""
    weight = _weight()
    matrix = _matrix(ggml, type_name, weight)
    reference = _dequantized(matrix).astype(np.float64)
    x = np.asarray(mx.random.normal((rows, weight.shape[1]), key=mx.random.key(rows)))
    exact = x.astype(np.float64) @ reference.T
    kernels = matrix.product(x, 2, ggml.shared_threadpool(2, 0))
    for sgemm in (MklSgemm(), None):
        for slice_values in (dequant_gemm.SLICE_VALUES, 13 * weight.shape[1]):
            gemm = DequantizedGemm(sgemm, slice_values)
            for threads in (1, 2):
                (result,) = gemm.products([matrix], x, threads)
                assert result.shape == (rows, weight.shape[0])
                assert _relative(result, exact) < EXACT, (gemm.library, slice_values, threads)
                assert _relative(result, kernels.astype(np.float64)) < KERNELS
            assert gemm.buffer_bytes <= 4 * slice_values


def test_only_prefill_rows_of_the_measured_types_take_the_dequantized_gemm(ggml: Ggml) -> None:
    weight = _weight()
    q5_0, q6_k, q8_0 = (_matrix(ggml, name, weight) for name in ("Q5_0", "Q6_K", "Q8_0"))
    assert takes_dequantized([q5_0], PREFILL_ROWS)
    assert takes_dequantized([q5_0, q5_0], 512)
    assert not takes_dequantized([q5_0], PREFILL_ROWS - 1)
    assert not takes_dequantized([q6_k], 512)
    assert not takes_dequantized([q8_0], 512)
    assert not takes_dequantized([q5_0, q8_0], 512)  # a group goes one way: ggml's graph


@pytest.mark.parametrize("rows", [PREFILL_ROWS - 1, PREFILL_ROWS, 512])
def test_q5_0_layers_and_sibling_groups_use_the_dequantized_gemm_from_prefill_rows(ggml: Ggml, rows: int) -> None:
    """A Q8Linear and a sibling group over Q5_0 matrices: from `PREFILL_ROWS` rows their products are the exact
    float product (the dequantized path), below it ggml's (off by its activation rounding, yet within 2 %)."""
    weight = _weight()
    matrices = [_matrix(ggml, "Q5_0", weight), _matrix(ggml, "Q5_0", np.ascontiguousarray(weight[::-1]))]
    references = [_dequantized(matrix).astype(np.float64) for matrix in matrices]
    x = mx.random.normal((1, rows, weight.shape[1]), key=mx.random.key(3))
    exact = [np.asarray(x[0]).astype(np.float64) @ reference.T for reference in references]
    layer = Q8Linear(Q8Weights(matrices[0]), None)
    group = SharedInputProducts(matrices)
    threads = ggml_threads()
    pool = ggml.shared_threadpool(threads, 0)
    results = [np.asarray(layer(x))[0]] + [np.asarray(group.product(x, member, threads, pool))[0] for member in (0, 1)]
    errors = [_relative(result, reference) for result, reference in zip(results, [exact[0], *exact], strict=True)]
    if rows >= PREFILL_ROWS:
        assert max(errors) < EXACT
    else:
        assert min(errors) > EXACT * 10
        assert max(errors) < KERNELS
        grouped = GgmlProducts(matrices).products(np.asarray(x[0]), threads, pool)
        np.testing.assert_array_equal(results[1], grouped[0])


def test_a_prefill_pass_inside_logits_discarded_skips_the_head_and_fills_the_same_cache(ggml: Ggml) -> None:
    """The q8_0 fixture model (tied head: its embedding's `as_linear`): inside `logits_discarded` the logits are
    zeros and no product of the head runs; the cache holds what a plain pass leaves; outside, the logits are back."""
    require_linux_cpu()
    del ggml
    model = exo_load_model(
        FIXTURE_MODELS_DIR / "tiny-qwen-tools", ShardAssignment(), cpu_kernels=CpuKernels("auto", weights="q8_0")
    ).model
    embedding = cast(nn.Module, model["model"])["embed_tokens"]
    assert isinstance(embedding, Q8Embedding)
    tokens = mx.array([[11, 42, 7, 300, 5, 99, 123, 8]])
    plain_cache, skipped_cache = make_prompt_cache(model), make_prompt_cache(model)
    plain = model(tokens, cache=plain_cache)
    calls: list[int] = []
    product = embedding.q8.product
    embedding.q8.product = lambda x: (calls.append(x.shape[0]), product(x))[1]  # pyright: ignore[reportAttributeAccessIssue]
    with logits_discarded():
        skipped = model(tokens, cache=skipped_cache)
    mx.eval(plain, skipped, [layer.state for layer in plain_cache], [layer.state for layer in skipped_cache])
    assert calls == []
    assert skipped.shape == plain.shape
    assert not bool(mx.any(skipped != 0).item())
    assert bool(mx.any(plain != 0).item())
    for before, after in zip(plain_cache, skipped_cache, strict=True):
        for left, right in zip(before.state, after.state, strict=True):
            np.testing.assert_array_equal(np.asarray(left), np.asarray(right))
    # Past a verification's 16 rows (which the decode graph computes with its own head): the model's head.
    again = model(mx.concatenate([tokens, tokens, tokens], axis=1), cache=skipped_cache)
    assert calls == [24]
    assert bool(mx.any(again != 0).item())


def test_an_untied_head_is_marked_and_skipped_only_inside_logits_discarded(ggml: Ggml) -> None:
    weight = _weight()
    model = nn.Module()
    model.lm_head = Q8Linear(Q8Weights(_matrix(ggml, "Q8_0", weight)), None)
    model.other = Q8Linear(Q8Weights(_matrix(ggml, "Q8_0", weight)), None)
    assert mark_output_head(model)
    x = mx.random.normal((1, 3, weight.shape[1]), key=mx.random.key(1))
    with logits_discarded():
        assert not bool(mx.any(model.lm_head(x) != 0).item())
        assert bool(mx.any(model.other(x) != 0).item())  # not the head: computed
    assert bool(mx.any(model.lm_head(x) != 0).item())
    assert not mark_output_head(nn.Module())
