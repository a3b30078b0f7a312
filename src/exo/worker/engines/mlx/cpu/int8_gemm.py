"""Int8 products through MKL's integer GEMM (`cblas_gemm_s8u8s32`), from the `mkl` wheel exo already depends on.

y = x · Wᵀ with W (out × in) stored as int8 with one float32 scale per output row, and x (rows × in) quantized per
row to int8 when the product runs. MKL's routine takes the left matrix as *unsigned* 8-bit and the right as signed,
with an offset added to each: activations are stored as q + 128 and the left offset −128 gives back q exactly, so
the int32 result is Σ q·w and y = result · x_scale[row] · w_scale[column].

A candidate kernel for serving quantized weights on a CPU (issue 33): the bench (`bench.quant_kernels`) measures
it against float32 BLAS, mlx's `quantized_matmul` and ggml's kernels. MKL picks its code path for the CPU (VNNI or
AMX where the CPU has them, AVX2 otherwise), so its speed depends on the machine more than a float32 GEMM's does.
This module never imports mlx: numpy and ctypes only.
"""

import ctypes
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from exo.worker.engines.mlx.cpu.blas import find_pypi_mkl

# CBLAS enumerations as mkl_cblas.h defines them.
_ROW_MAJOR = 101
_NO_TRANS = 111
_TRANS = 112
_PACKED = 151
_B_MATRIX = 162
_FIX_OFFSET = 173
ACTIVATION_OFFSET = 128
"""Added to the signed activation values to store them as unsigned bytes (and subtracted by MKL's left offset)."""
QMAX = 127


@dataclass(frozen=True)
class Int8Weights:
    """A weight matrix (out × in) as int8 with one float32 scale per output row; `packed` is MKL's own layout of the
    same values (from `MklInt8.pack`), which its compute routine may read faster."""

    values: npt.NDArray[np.int8]
    scales: npt.NDArray[np.float32]
    packed: npt.NDArray[np.uint8] | None = None

    @property
    def shape(self) -> tuple[int, int]:
        rows, columns = self.values.shape
        return int(rows), int(columns)

    @property
    def nbytes(self) -> int:
        """Bytes a product reads: the int8 values and the scales."""
        return int(self.values.nbytes + self.scales.nbytes)


def quantize_rows(matrix: npt.NDArray[np.float32]) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.float32]]:
    """Symmetric per-row int8: each row scaled so its largest magnitude is 127 (an all-zero row gets scale 1)."""
    largest = np.abs(matrix).max(axis=1)
    scales = np.where(largest > 0, largest / QMAX, 1.0).astype(np.float32)
    quantized = np.rint(matrix / scales[:, None])
    return np.clip(quantized, -QMAX, QMAX).astype(np.int8), scales


def quantize_weights(weights: npt.NDArray[np.float32]) -> Int8Weights:
    values, scales = quantize_rows(np.ascontiguousarray(weights, dtype=np.float32))
    return Int8Weights(values=values, scales=scales)


def quantize_activations(x: npt.NDArray[np.float32]) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.float32]]:
    """Per-row int8 activations stored as unsigned bytes (q + 128), with their per-row scales."""
    values, scales = quantize_rows(np.ascontiguousarray(x, dtype=np.float32))
    return (values.astype(np.int16) + ACTIVATION_OFFSET).astype(np.uint8), scales


class MklInt8:
    """The `cblas_gemm_s8u8s32` family of one MKL library (by default the `mkl` wheel's `libmkl_rt`)."""

    def __init__(self, library: Path | None = None) -> None:
        path = library or find_pypi_mkl()
        if path is None:
            raise FileNotFoundError("no libmkl_rt: the `mkl` wheel is not installed (Linux x86_64 only)")
        mkl = ctypes.CDLL(str(path))
        self.library = path
        integer, pointer, real, offset = ctypes.c_int, ctypes.c_void_p, ctypes.c_float, ctypes.c_int8
        self._gemm = mkl.cblas_gemm_s8u8s32
        self._gemm.restype = None
        self._gemm.argtypes = [
            *(integer,) * 7,
            real,
            pointer,
            integer,
            offset,
            pointer,
            integer,
            offset,
            real,
            pointer,
            integer,
            pointer,
        ]
        self._compute = mkl.cblas_gemm_s8u8s32_compute
        self._compute.restype = None
        self._compute.argtypes = self._gemm.argtypes
        self._pack_size = mkl.cblas_gemm_s8u8s32_pack_get_size
        self._pack_size.restype = ctypes.c_size_t
        self._pack_size.argtypes = [integer] * 4
        self._pack = mkl.cblas_gemm_s8u8s32_pack
        self._pack.restype = None
        self._pack.argtypes = [*(integer,) * 6, pointer, integer, pointer]
        self._no_offset = np.zeros(1, dtype=np.int32)

    def pack(self, weights: Int8Weights, rows: int) -> Int8Weights:
        """`weights` with MKL's packed copy for products of `rows` activation rows (MKL's layout may depend on it)."""
        out_features, in_features = weights.shape
        size = int(self._pack_size(_B_MATRIX, rows, out_features, in_features))
        packed = np.empty(size, dtype=np.uint8)
        self._pack(
            _ROW_MAJOR,
            _B_MATRIX,
            _TRANS,
            rows,
            out_features,
            in_features,
            weights.values.ctypes.data,
            in_features,
            packed.ctypes.data,
        )
        return Int8Weights(values=weights.values, scales=weights.scales, packed=packed)

    def integer_product(
        self, activations: npt.NDArray[np.uint8], weights: Int8Weights, out: npt.NDArray[np.int32] | None = None
    ) -> npt.NDArray[np.int32]:
        """Σ (a − 128)·w as int32 (rows × out): the GEMM alone, packed when `weights.packed` is set."""
        rows, in_features = activations.shape
        out_features, weight_in = weights.shape
        if weight_in != in_features:
            raise ValueError(f"activations have {in_features} columns, weights {weight_in}")
        if activations.dtype != np.uint8 or not activations.flags.c_contiguous:
            raise ValueError("activations must be C-contiguous uint8")
        result = np.empty((rows, out_features), dtype=np.int32) if out is None else out
        routine, right, transpose = (
            (self._gemm, weights.values.ctypes.data, _TRANS)
            if weights.packed is None
            else (self._compute, weights.packed.ctypes.data, _PACKED)
        )
        routine(
            _ROW_MAJOR,
            _NO_TRANS,
            transpose,
            _FIX_OFFSET,
            rows,
            out_features,
            in_features,
            1.0,
            activations.ctypes.data,
            in_features,
            -ACTIVATION_OFFSET,
            right,
            in_features,
            0,
            0.0,
            result.ctypes.data,
            out_features,
            self._no_offset.ctypes.data,
        )
        return result

    def matmul(self, x: npt.NDArray[np.float32], weights: Int8Weights) -> npt.NDArray[np.float32]:
        """x · Wᵀ in float32: x quantized per row, the int8 GEMM, then both scales applied."""
        activations, activation_scales = quantize_activations(x)
        product = self.integer_product(activations, weights)
        result = product.astype(np.float32)
        result *= activation_scales[:, None]
        result *= weights.scales[None, :]
        return result
