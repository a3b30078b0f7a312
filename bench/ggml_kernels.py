"""ggml's CPU matrix products for the kernel bench, from the shared libraries the llama.cpp build leaves in `build/`.

The binding itself is the engine's (`exo.worker.engines.mlx.cpu.ggml_library`): one `GgmlProduct` here is one
`GgmlMatrix` (weights in a GGUF block type, quantized from float32 by ggml) multiplied over a fixed number of rows on
a thread pool of its own, as the bench compares candidates one at a time.
"""

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from exo.worker.engines.mlx.cpu.ggml_library import GGML_TYPES, Ggml, GgmlMatrix

__all__ = ["GGML_TYPES", "Ggml", "GgmlProduct", "ggml_library_dir"]


def ggml_library_dir(binary: Path) -> Path:
    """Where the shared libraries of a llama.cpp build are: beside its `llama-server`."""
    return binary.parent


@dataclass
class GgmlProduct:
    """y = x · Wᵀ with W stored in a GGUF block type, computed again and again over `rows` rows."""

    matrix: GgmlMatrix
    type_name: str
    rows: int
    threads: int
    _pool: int = field(repr=False)

    @property
    def weight_bytes(self) -> int:
        return self.matrix.nbytes

    @classmethod
    def create(
        cls, ggml: Ggml, weights: npt.NDArray[np.float32], type_name: str, rows: int, threads: int
    ) -> "GgmlProduct":
        out_features, in_features = weights.shape
        matrix = GgmlMatrix(ggml, type_name, out_features, in_features)
        matrix.fill(0, weights)
        return cls(matrix=matrix, type_name=type_name, rows=rows, threads=threads, _pool=ggml.new_threadpool(threads))

    def run(self, x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """The (rows × out) product of `x` (rows × in)."""
        if x.shape[0] != self.rows:
            raise ValueError(f"this product takes {self.rows} rows, not {x.shape[0]}")
        return self.matrix.product(x, self.threads, self._pool)

    def close(self) -> None:
        self.matrix.close()
        self.matrix.ggml.threadpool_free(self._pool)
