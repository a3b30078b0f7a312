"""Linear layers and embeddings whose weights stay int8 on a CPU (`--cpu-weights int8`, issue 33).

A float32 decode step reads every weight once: about 2 GB for a 0.5B model, which bounds decode by the memory
bandwidth. Here each weight matrix is held as int8 with one float32 scale per output row (symmetric), a quarter of
the bytes, and each product quantizes its activations per row and runs MKL's integer GEMM (`int8_gemm.py`). The
conversion goes one matrix at a time (an mlx-community quantized matrix is dequantized first), so loading holds the
checkpoint plus one float32 matrix, never the whole model in float32.

The layers run inside the mlx model the way `kernels.py` does: the activations are evaluated, read through numpy
(no copy), and the product comes back as a new mlx array. Biases, norms and everything that is not a matrix product
stay in mlx, in float32. An embedding lookup dequantizes only the rows it looks up.
"""

from functools import cache
from typing import cast

import mlx.core as mx
import numpy as np
import numpy.typing as npt
from mlx import nn
from mlx.utils import tree_flatten

from exo.worker.engines.mlx.cpu.int8_gemm import ACTIVATION_OFFSET, QMAX, Int8Weights, MklInt8, quantize_weights
from exo.worker.engines.mlx.cpu.matrix_replacement import replace_modules


@cache
def mkl_int8() -> MklInt8:
    """The process's one MKL handle (loading the library once)."""
    return MklInt8()


CONVERSION_ROWS = 8192
"""Rows converted at a time: a 151936 x 896 output matrix then never exists whole in float32 (0.5 GB, and numpy's
temporaries several times that), only 8192 rows of it (29 MB)."""


def float32_rows(module: nn.Module, start: int, stop: int) -> mx.array:
    """Rows [start, stop) of a Linear's, QuantizedLinear's, Embedding's or QuantizedEmbedding's weight matrix, in
    float32 (a quantized one's groups run along each row, so a slice of rows dequantizes on its own)."""
    weight = module["weight"][start:stop]
    if "scales" in module:
        bits = int(getattr(module, "bits", 4))
        group_size = int(getattr(module, "group_size", 64))
        mode = str(getattr(module, "mode", "affine"))
        biases = module.get("biases")
        scales = module["scales"][start:stop]
        weight = mx.dequantize(
            weight, scales, None if biases is None else biases[start:stop], group_size, bits, mode=mode
        )
    return weight.astype(mx.float32)


def int8_from(module: nn.Module) -> Int8Weights:
    """The module's weights as int8 with per-row scales, converted `CONVERSION_ROWS` rows at a time."""
    rows = int(module["weight"].shape[0])
    values: npt.NDArray[np.int8] | None = None
    scales = np.empty(rows, dtype=np.float32)
    for start in range(0, rows, CONVERSION_ROWS):
        stop = min(start + CONVERSION_ROWS, rows)
        matrix = float32_rows(module, start, stop)
        mx.eval(matrix)
        piece = quantize_weights(np.asarray(matrix))
        if values is None:
            values = np.empty((rows, piece.shape[1]), dtype=np.int8)
        values[start:stop] = piece.values
        scales[start:stop] = piece.scales
        del matrix
    if values is None:
        raise ValueError("a weight matrix without rows")
    return Int8Weights(values=values, scales=scales)


def int8_product(x: mx.array, weights: Int8Weights) -> mx.array:
    """x · Wᵀ over x's leading dimensions: x quantized per row, MKL's s8u8s32 GEMM, both scales applied."""
    mx.eval(x)
    flat = np.asarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
    largest = np.abs(flat).max(axis=1)
    activation_scales = np.where(largest > 0, largest / QMAX, 1.0).astype(np.float32)
    quantized = flat * (1.0 / activation_scales)[:, None]
    np.rint(quantized, out=quantized)
    quantized += ACTIVATION_OFFSET  # stored as unsigned bytes: q + 128 lies in 1..255
    activations = quantized.astype(np.uint8)
    product = mkl_int8().integer_product(activations, weights)
    result = product.astype(np.float32)
    result *= activation_scales[:, None]
    result *= weights.scales[None, :]
    return mx.array(result.reshape(*x.shape[:-1], weights.shape[0]))


class Int8Linear(nn.Module):
    """A Linear layer with int8 weights (its bias, if any, stays an mlx float32 array)."""

    def __init__(self, weights: Int8Weights, bias: mx.array | None) -> None:
        super().__init__()
        # A plain attribute, not an mlx parameter: mlx's tree utilities (set_dtype, parameters) leave it alone.
        self.int8 = weights
        if bias is not None:
            self.bias = bias.astype(mx.float32)

    def __call__(self, x: mx.array) -> mx.array:
        product = int8_product(x, self.int8)
        return product + self["bias"] if "bias" in self else product


class Int8Embedding(nn.Module):
    """An embedding table held as int8: a lookup dequantizes the rows it reads; `as_linear` (tied output
    projection) is an int8 product."""

    def __init__(self, weights: Int8Weights) -> None:
        super().__init__()
        self.int8 = weights

    def __call__(self, ids: mx.array) -> mx.array:
        mx.eval(ids)
        rows = np.asarray(ids).astype(np.int64)
        values: npt.NDArray[np.float32] = self.int8.values[rows].astype(np.float32)
        values *= self.int8.scales[rows][..., None]
        return mx.array(values)

    def as_linear(self, x: mx.array) -> mx.array:
        return int8_product(x, self.int8)


def _replacement(module: nn.Module) -> nn.Module | None:
    if isinstance(module, (nn.Linear, nn.QuantizedLinear)):
        return Int8Linear(int8_from(module), module.get("bias"))
    if isinstance(module, (nn.Embedding, nn.QuantizedEmbedding)):
        return Int8Embedding(int8_from(module))
    return None


def quantize_model(model: nn.Module) -> int:
    """Replace every Linear, QuantizedLinear, Embedding and QuantizedEmbedding inside `model` with its int8 form,
    one matrix at a time (each original is released as soon as it is replaced); returns how many were replaced.
    Other parameters are left as they are (the caller sets their dtype)."""
    return replace_modules(model, _replacement)


def held_bytes(model: nn.Module) -> int:
    """Bytes of all of `model`'s weights as held: its mlx parameters plus its int8 matrices and scales."""
    parameters = cast(list[tuple[str, mx.array]], tree_flatten(model.parameters()))
    return sum(value.nbytes for _, value in parameters) + int8_bytes(model)


def int8_bytes(model: nn.Module) -> int:
    """Bytes of the int8 weights and their scales held by `model`'s int8 layers."""
    return sum(
        module.int8.nbytes for _, module in model.named_modules() if isinstance(module, (Int8Linear, Int8Embedding))
    )
