"""Sibling matrix layers that multiply the same input, computed as one ggml graph (issue 33).

Attention's q/k/v projections and the MLP's gate/up projections each read the same activations. Computed apart,
each product pays its own `mx.eval` barrier, numpy conversion, copy into ggml, pool wake-up and graph compute;
`SharedInputProducts` pays them once for the group. It is transparent to the model's code (mlx-lm's Attention and
MLP call each sibling in turn with the same array): the first sibling called with an input computes every
sibling's product, and the others take theirs when called with that same array object. Each result is handed out
once; a sibling called with a different array, or a second time with the same one, computes the group afresh, so
no call ever receives a product of another input.
"""

from collections.abc import Sequence

import mlx.core as mx
import numpy as np
import numpy.typing as npt

from exo.worker.engines.mlx.cpu.dequant_gemm import dequantized_gemm, takes_dequantized
from exo.worker.engines.mlx.cpu.ggml_library import GgmlMatrix, GgmlProducts


def activation_rows(x: mx.array) -> npt.NDArray[np.float32]:
    """x evaluated and seen by numpy as rows (leading dimensions flattened × last), without a copy where mlx's
    buffer is already float32 and contiguous."""
    mx.eval(x)
    return np.asarray(x, dtype=np.float32).reshape(-1, x.shape[-1])


def as_mlx(product: npt.NDArray[np.float32], x: mx.array) -> mx.array:
    """A product's rows back as an mlx array shaped like x but for its last dimension."""
    return mx.array(product.reshape(*x.shape[:-1], product.shape[-1]))


class SharedInputProducts:
    """The products of sibling matrices (member 0, 1, …) over one input, computed together and handed out once
    each."""

    def __init__(self, matrices: Sequence[GgmlMatrix]) -> None:
        self._products = GgmlProducts(matrices)
        self._input: mx.array | None = None
        self._pending: list[mx.array | None] = [None] * len(matrices)

    @property
    def size(self) -> int:
        return len(self._pending)

    def product(self, x: mx.array, member: int, threads: int, pool: int) -> mx.array:
        """x · Wᵀ for the member's matrix: taken from the group's last computation when x is the very array it was
        computed for and this member's result is still untaken, else computed now for the whole group."""
        if x is not self._input or self._pending[member] is None:
            rows = activation_rows(x)
            if takes_dequantized(self._products.matrices, rows.shape[0]):
                products = dequantized_gemm().products(self._products.matrices, rows, threads)
            else:
                products = self._products.products(rows, threads, pool)
            self._pending = [as_mlx(product, x) for product in products]
            self._input = x
        result = self._pending[member]
        assert result is not None
        self._pending[member] = None
        if all(pending is None for pending in self._pending):
            self._input = None  # every sibling served: hold neither the input nor any result
        return result
