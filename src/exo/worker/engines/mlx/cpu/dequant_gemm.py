"""Prefill products of ggml-held matrices (`--cpu-weights gguf`) as dequantized slices times a float32
GEMM (issue 33: "prefill is compute-bound: its products may dequantize a block at a time into a BLAS GEMM if that
measures faster").

Over a prefill piece's hundreds of rows, ggml's Q5_0 kernel (which quantizes the activations to Q8_0 and takes
integer dot products) measured 1.3-1.5x slower on the 2-core AMD EPYC (AVX2, no VNNI) than dequantizing the matrix
and multiplying it with MKL's `sgemm` in float32, dequantization included
(docs/PERFORMANCE.md section 12, "Prefill products"). So a product over at least `PREFILL_ROWS` rows by matrices
of `DEQUANTIZED_TYPES` dequantizes each matrix a slice of output rows at a time (ggml's own `to_float` of the
type: exactly the values the blocks hold) into one reused float32 buffer of at most `SLICE_VALUES` values (32 MiB)
and multiplies each slice with `cblas_sgemm`. No float32 copy of any matrix outlives a product: the buffer is the
only float32 weight memory, whatever the model (17 MB for the default model's largest Q5_0 matrices).

The GEMM is MKL's from the `mkl` wheel exo depends on (Linux x86_64), on the product's thread count for the calling
thread only (`MKL_Set_Num_Threads_Local`: the runner keeps MKL's global count at one for mlx's own matmuls);
without MKL, numpy's matmul (its bundled BLAS). The dequantization is split over the same threads (ggml's
dequantizers are single-threaded C; ctypes releases the GIL). The result is the float32 product of the dequantized
matrix (the activations are not rounded as ggml's kernels round them), so it agrees with ggml's product to within
the activation rounding those kernels add (under 2 % of the output's largest magnitude; the tests).

This module never imports mlx: numpy and ctypes only.
"""

import ctypes
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from itertools import pairwise
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

from exo.worker.engines.mlx.cpu.blas import find_pypi_mkl
from exo.worker.engines.mlx.cpu.ggml_library import GgmlMatrix

PREFILL_ROWS: Final = 256
"""Products over at least this many rows may dequantize and call the GEMM; fewer rows (decode steps, batches, the
first prefill piece of 128) stay ggml's block kernels. Chosen by measurement on the 2-core AMD EPYC
(docs/PERFORMANCE.md section 12, "Prefill products"): the default model's Q5_0 gate+up pair took 156 ms in ggml
against 114 ms dequantized at 256 rows, 289 against 190 at 512, but 73 against 90 at 128 and twice ggml's time at
16-64 rows."""
DEQUANTIZED_TYPES: Final = frozenset({"Q5_0"})
"""Block types whose prefill products go through the dequantized GEMM: those measured faster that way (the default
GGUF's Q5_0, 133 of its 170 matrices). Not the K-quants: ggml's Q4_K and Q6_K kernels (with their 256-value Q8_K
activations) were as fast as the dequantized GEMM or faster at every row count measured up to 512 (Q6_K 48
against 70 ms at 512 rows). Not Q8_0, ggml's cheapest kernel, not measured against it (`--cpu-weights q8_0` keeps
its products; a sibling group mixing Q8_0 with Q5_0, the default GGUF's q/k/v in half its layers, stays ggml's)."""
SLICE_VALUES: Final = 1 << 23
"""The reused float32 buffer's size in values (32 MiB): a 4864 × 896 matrix dequantizes whole, a 151,936 × 896
output head 9,362 rows at a time."""

_ROW_MAJOR: Final = 101
_NO_TRANS: Final = 111
_TRANS: Final = 112


def takes_dequantized(matrices: Sequence[GgmlMatrix], rows: int) -> bool:
    """Whether a product of `rows` rows by these matrices (one graph's worth: siblings go together) goes through the
    dequantized GEMM: from `PREFILL_ROWS` rows, where every matrix's type is one of `DEQUANTIZED_TYPES` and each holds
    its blocks as stored (a repacked or packed one cannot be dequantized)."""
    return rows >= PREFILL_ROWS and all(
        matrix.type_name in DEQUANTIZED_TYPES and matrix.holds_stored_blocks for matrix in matrices
    )


class MklSgemm:
    """`cblas_sgemm` of one MKL library (by default the `mkl` wheel's `libmkl_rt`, the library a runner preloads),
    run on a given number of threads for the calling thread only."""

    def __init__(self, library: Path | None = None) -> None:
        path = library or find_pypi_mkl()
        if path is None:
            raise FileNotFoundError("no libmkl_rt: the `mkl` wheel is not installed (Linux x86_64 only)")
        mkl = ctypes.CDLL(str(path))
        integer, pointer, real = ctypes.c_int, ctypes.c_void_p, ctypes.c_float
        self._sgemm = mkl.cblas_sgemm
        self._sgemm.restype = None
        self._sgemm.argtypes = [integer] * 6 + [real, pointer, integer, pointer, integer, real, pointer, integer]
        self._local_threads = mkl.MKL_Set_Num_Threads_Local
        self._local_threads.restype, self._local_threads.argtypes = integer, [integer]

    def multiply(
        self,
        x: npt.NDArray[np.float32],
        weights: npt.NDArray[np.float32],
        out: npt.NDArray[np.float32],
        column: int,
        threads: int,
    ) -> None:
        """out[:, column : column + len(weights)] = x · weightsᵀ (x rows × in, weights n × in, both C-contiguous;
        out C-contiguous, rows × any width)."""
        rows, width = x.shape
        count = weights.shape[0]
        destination = out.ctypes.data + column * out.itemsize
        before = self._local_threads(threads)
        try:
            self._sgemm(
                _ROW_MAJOR,
                _NO_TRANS,
                _TRANS,
                rows,
                count,
                width,
                1.0,
                x.ctypes.data,
                width,
                weights.ctypes.data,
                width,
                0.0,
                destination,
                out.shape[1],
            )
        finally:
            self._local_threads(before)


def numpy_multiply(
    x: npt.NDArray[np.float32],
    weights: npt.NDArray[np.float32],
    out: npt.NDArray[np.float32],
    column: int,
    threads: int,
) -> None:
    """`MklSgemm.multiply` through numpy's matmul (its own BLAS and threads), where MKL is not installed."""
    del threads
    out[:, column : column + weights.shape[0]] = x @ weights.T


class DequantizedGemm:
    """Products of ggml matrices over many rows: each matrix dequantized a slice at a time into one reused buffer and
    multiplied by a float32 GEMM. One per process (`dequantized_gemm`); not for concurrent callers (the runner's
    products run on one thread)."""

    def __init__(self, sgemm: MklSgemm | None, slice_values: int = SLICE_VALUES) -> None:
        self._multiply = sgemm.multiply if sgemm is not None else numpy_multiply
        self.library = "mkl" if sgemm is not None else "numpy"
        self.slice_values = slice_values
        self._buffer: npt.NDArray[np.float32] | None = None
        self._workers: dict[int, ThreadPoolExecutor] = {}

    @property
    def buffer_bytes(self) -> int:
        """Bytes of the float32 buffer allocated so far (at most 4 × `slice_values`)."""
        return 0 if self._buffer is None else int(self._buffer.nbytes)

    def products(
        self, matrices: Sequence[GgmlMatrix], x: npt.NDArray[np.float32], threads: int
    ) -> list[npt.NDArray[np.float32]]:
        """x (rows × in) times each matrix (of width in): one new (rows × out) float32 array per matrix, in order."""
        source = np.ascontiguousarray(x, dtype=np.float32)
        rows, width = source.shape
        results: list[npt.NDArray[np.float32]] = []
        for matrix in matrices:
            out_features, in_features = matrix.shape
            if in_features != width:
                raise ValueError(f"rows of {width} values times a matrix of width {in_features}")
            result = np.empty((rows, out_features), dtype=np.float32)
            step = max(1, min(out_features, self.slice_values // in_features))
            buffer = self._slice_buffer(step * in_features)
            for start in range(0, out_features, step):
                stop = min(start + step, out_features)
                weights = buffer[: (stop - start) * in_features].reshape(stop - start, in_features)
                self._dequantize(matrix, start, stop, weights, threads)
                self._multiply(source, weights, result, start, threads)
            results.append(result)
        return results

    def _slice_buffer(self, values: int) -> npt.NDArray[np.float32]:
        if self._buffer is None or self._buffer.size < values:
            self._buffer = np.empty(values, dtype=np.float32)
        return self._buffer

    def _dequantize(
        self, matrix: GgmlMatrix, start: int, stop: int, weights: npt.NDArray[np.float32], threads: int
    ) -> None:
        """Rows [start, stop) of `matrix` into `weights`, split over `threads` threads."""
        parts = max(1, min(threads, stop - start))
        if parts == 1:
            matrix.dequantize(start, stop, weights)
            return
        bounds = [start + (stop - start) * part // parts for part in range(parts + 1)]
        workers = self._workers.get(parts)
        if workers is None:
            workers = self._workers[parts] = ThreadPoolExecutor(parts - 1, thread_name_prefix="dequantize")
        pending = [
            workers.submit(matrix.dequantize, low, high, weights[low - start : high - start])
            for low, high in pairwise(bounds[1:])
        ]
        matrix.dequantize(bounds[0], bounds[1], weights[: bounds[1] - start])
        for done in pending:
            done.result()


@cache
def dequantized_gemm() -> DequantizedGemm:
    """The process's one `DequantizedGemm`: MKL's sgemm where the `mkl` wheel is installed, else numpy's."""
    try:
        sgemm: MklSgemm | None = MklSgemm()
    except (FileNotFoundError, OSError, AttributeError):
        sgemm = None
    return DequantizedGemm(sgemm)
