"""MKL's integer GEMM wrapper agrees with the float32 product within the error per-row int8 quantization allows.

Tolerance: both operands are rounded to 127 levels per row, so each product term is off by at most about half a
step of each; over the row, the result stays within 2 % of the output's largest magnitude for Gaussian data (the
bench measures about 1.3 %). The integer part alone is exact: checked against numpy's int64 product.
"""

import numpy as np
import pytest

from exo.worker.engines.mlx.cpu.blas import find_pypi_mkl
from exo.worker.engines.mlx.cpu.int8_gemm import (
    ACTIVATION_OFFSET,
    MklInt8,
    quantize_activations,
    quantize_rows,
    quantize_weights,
)

TOLERANCE = 0.02
pytestmark = pytest.mark.skipif(find_pypi_mkl() is None, reason="the mkl wheel exists only for Linux x86_64")


@pytest.fixture(scope="module")
def mkl() -> MklInt8:
    return MklInt8()


def _data(rows: int, out_features: int = 96, in_features: int = 160) -> tuple[np.ndarray, np.ndarray]:
    generator = np.random.default_rng(rows)
    weights = generator.standard_normal((out_features, in_features)).astype(np.float32)
    x = generator.standard_normal((rows, in_features)).astype(np.float32)
    return weights, x


def _relative_error(result: np.ndarray, reference: np.ndarray) -> float:
    return float(np.abs(result - reference).max() / np.abs(reference).max())


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 512])
def test_matmul_agrees_with_float32(mkl: MklInt8, rows: int) -> None:
    weights, x = _data(rows)
    result = mkl.matmul(x, quantize_weights(weights))
    assert result.shape == (rows, weights.shape[0])
    assert result.dtype == np.float32
    assert _relative_error(result, x @ weights.T) < TOLERANCE


@pytest.mark.parametrize("rows", [1, 4, 512])
def test_packed_weights_give_the_same_result(mkl: MklInt8, rows: int) -> None:
    weights, x = _data(rows)
    plain = quantize_weights(weights)
    packed = mkl.pack(plain, rows)
    assert packed.packed is not None
    np.testing.assert_array_equal(mkl.matmul(x, packed), mkl.matmul(x, plain))


def test_integer_product_is_exact(mkl: MklInt8) -> None:
    weights, x = _data(7)
    quantized = quantize_weights(weights)
    activations, _ = quantize_activations(x)
    expected = (activations.astype(np.int64) - ACTIVATION_OFFSET) @ quantized.values.astype(np.int64).T
    np.testing.assert_array_equal(mkl.integer_product(activations, quantized), expected)


def test_quantize_rows_scales_each_row_to_127() -> None:
    matrix = np.array([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0], [300.0, 3.0, -150.0]], dtype=np.float32)
    values, scales = quantize_rows(matrix)
    np.testing.assert_array_equal(np.abs(values).max(axis=1), [127, 0, 127])
    np.testing.assert_allclose(scales, [2.0 / 127, 1.0, 300.0 / 127])
    np.testing.assert_allclose(values * scales[:, None], matrix, atol=float(scales.max()) / 2)


def test_mismatched_shapes_are_refused(mkl: MklInt8) -> None:
    weights, _ = _data(1)
    activations, _ = quantize_activations(np.ones((2, weights.shape[1] + 1), dtype=np.float32))
    with pytest.raises(ValueError, match="columns"):
        mkl.integer_product(activations, quantize_weights(weights))
