"""The measuring half of `bench.quant_kernels` (it imports mlx, so it runs in the child with the BLAS preloaded)."""

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import mlx.core as mx
import numpy as np
import numpy.typing as npt

from bench.ggml_kernels import Ggml, GgmlProduct, RowsProduct, ggml_library_dir
from bench.llama_cpp_build import BUILD_ROOT, find_llama_server, server_binary
from bench.machine import blas_description, cpu_model, exo_commit
from bench.quant_kernels import GGML_TYPES, KernelReport, KernelResult, time_call
from exo.worker.engines.mlx.cpu.ggml_library import GGML_TYPES as GGML_TYPE_IDS
from exo.worker.engines.mlx.cpu.ggml_locate import find_ggml_library, ggml_missing_reason
from exo.worker.engines.mlx.cpu.int8_gemm import MklInt8, quantize_weights
from exo.worker.engines.mlx.cpu.rows_kernel import RowsKernel, rows_kernel, rows_kernel_missing_reason

MLX_GROUP_SIZE = 64
REPACKED_CANDIDATES = ("Q4_K",)
"""Types also measured held in ggml's interleaved layout, as llama.cpp and the engine hold them."""
Product = Callable[[npt.NDArray[np.float32]], npt.NDArray[np.float32]]


@dataclass
class _Candidate:
    name: str
    weight_bytes: int
    product: Product
    stored_bytes: int = 0
    close: Callable[[], None] = lambda: None


def _mlx_float32(weights: npt.NDArray[np.float32]) -> _Candidate:
    matrix = mx.array(weights)
    mx.eval(matrix)

    def product(x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        result = mx.array(x) @ matrix.T
        mx.eval(result)
        return np.array(result)

    return _Candidate("float32 mx.matmul (MKL)", weights.nbytes, product)


def _mlx_quantized(weights: npt.NDArray[np.float32], bits: int) -> _Candidate:
    quantized, scales, biases = mx.quantize(mx.array(weights), group_size=MLX_GROUP_SIZE, bits=bits)
    mx.eval(quantized, scales, biases)
    nbytes = quantized.nbytes + scales.nbytes + biases.nbytes

    def product(x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        result = mx.quantized_matmul(
            mx.array(x), quantized, scales, biases, transpose=True, group_size=MLX_GROUP_SIZE, bits=bits
        )
        mx.eval(result)
        return np.array(result)

    return _Candidate(f"mlx quantized_matmul {bits}-bit g{MLX_GROUP_SIZE}", nbytes, product)


def _mkl_int8(mkl: MklInt8, weights: npt.NDArray[np.float32], rows: int, *, packed: bool) -> _Candidate:
    quantized = quantize_weights(weights)
    if packed:
        quantized = mkl.pack(quantized, rows)
    name = "MKL s8u8s32 int8/row, packed" if packed else "MKL s8u8s32 int8/row"
    # Packed, the int8 values are no longer needed: MKL's copy and the scales are what stays in memory.
    stored = quantized.nbytes if quantized.packed is None else quantized.packed.nbytes + quantized.scales.nbytes
    return _Candidate(name, quantized.nbytes, lambda x: mkl.matmul(x, quantized), stored_bytes=stored)


def _ggml(
    ggml: Ggml, weights: npt.NDArray[np.float32], type_name: str, rows: int, threads: int, *, repacked: bool = False
) -> _Candidate:
    product = GgmlProduct.create(ggml, weights, type_name, rows, threads, repacked=repacked)
    name = f"ggml {type_name}{' repacked' if repacked else ''}"
    return _Candidate(name, product.weight_bytes, product.run, close=product.close)


def _exo_rows(
    ggml: Ggml,
    kernel: RowsKernel,
    weights: npt.NDArray[np.float32],
    *,
    type_name: str,
    rows: int,
    threads: int,
    repacked: bool = False,
    packed: bool = False,
) -> _Candidate:
    product = RowsProduct.create(
        ggml, kernel, weights, type_name=type_name, rows=rows, threads=threads, repacked=repacked, packed=packed
    )
    name = f"exo rows {type_name}{' repacked' if repacked else ' packed' if packed else ''}"
    return _Candidate(name, product.weight_bytes, product.run, close=product.close)


def _candidates(
    weights: npt.NDArray[np.float32],
    rows: int,
    mkl: MklInt8 | None,
    ggml: Ggml | None,
    threads: int,
    *,
    rows_kernel: RowsKernel | None,
) -> Iterator[_Candidate]:
    """Each candidate for this matrix and row count, made only when its turn comes (the large ones hold GBs)."""
    yield _mlx_float32(weights)
    yield _mlx_quantized(weights, 4)
    yield _mlx_quantized(weights, 8)
    if mkl is not None:
        yield _mkl_int8(mkl, weights, rows, packed=False)
        yield _mkl_int8(mkl, weights, rows, packed=True)
    if ggml is not None:
        for kind in GGML_TYPES:
            if ggml.fits(kind, weights.shape[1]):
                yield _ggml(ggml, weights, kind, rows, threads)
                if rows_kernel is not None and rows_kernel.applies(GGML_TYPE_IDS[kind], weights.shape[1], rows):
                    yield _exo_rows(ggml, rows_kernel, weights, type_name=kind, rows=rows, threads=threads)
                if rows_kernel is not None and rows_kernel.packs(kind, *weights.shape):  # as the engine holds Q6_K
                    yield _exo_rows(ggml, rows_kernel, weights, type_name=kind, rows=rows, threads=threads, packed=True)
                if kind in REPACKED_CANDIDATES:  # as llama.cpp and the engine hold it
                    try:
                        repacked = _ggml(ggml, weights, kind, rows, threads, repacked=True)
                    except ValueError:  # no interleaved layout for this CPU or shape
                        continue
                    yield repacked
                    if rows_kernel is not None and rows_kernel.applies(
                        GGML_TYPE_IDS[kind], weights.shape[1], rows, repacked=True
                    ):
                        yield _exo_rows(
                            ggml, rows_kernel, weights, type_name=kind, rows=rows, threads=threads, repacked=True
                        )


def _measured(candidate: _Candidate, weights: npt.NDArray[np.float32], x: npt.NDArray[np.float32]) -> KernelResult:
    """The candidate's error against the float32 product, then its median time; its memory is released after."""
    reference = x @ weights.T
    try:
        error = float(np.abs(candidate.product(x) - reference).max() / np.abs(reference).max())
        seconds, repeats = time_call(lambda: candidate.product(x))
    finally:
        candidate.close()
    out_features, in_features = weights.shape
    return KernelResult(
        candidate=candidate.name,
        out_features=out_features,
        in_features=in_features,
        rows=x.shape[0],
        seconds=seconds,
        repeats=repeats,
        weight_bytes=candidate.weight_bytes,
        stored_bytes=candidate.stored_bytes or candidate.weight_bytes,
        max_relative_error=error,
    )


def _exo_rows_kernel(unavailable: dict[str, str]) -> RowsKernel | None:
    """exo's multi-row kernel from exo's own ggml build (`exo ggml build`: the same release as the bench's, so the
    same tensor layout), or None with the reason in `unavailable`."""
    folder = find_ggml_library()
    if folder is None:
        unavailable["exo rows"] = ggml_missing_reason()
        return None
    kernel = rows_kernel(folder)
    if kernel is None:
        unavailable["exo rows"] = rows_kernel_missing_reason(folder) or "not loaded"
    return kernel


def _progress(message: str) -> None:
    sys.stderr.write(f"[quant_kernels {datetime.now(UTC).strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


def measure(
    shapes: Sequence[tuple[int, int]],
    row_counts: Sequence[int],
    command: Sequence[str],
    llama_cpp_root: Path | None,
    threads: int,
) -> KernelReport:
    load_before = os.getloadavg()
    unavailable: dict[str, str] = {}
    try:
        mkl: MklInt8 | None = MklInt8()
    except (FileNotFoundError, OSError, AttributeError) as error:
        mkl = None
        unavailable["MKL s8u8s32"] = str(error)
    ggml: Ggml | None = None
    libraries = ggml_library_dir(server_binary(llama_cpp_root or BUILD_ROOT))
    try:
        ggml = Ggml(libraries)
    except OSError as error:
        missing = find_llama_server(llama_cpp_root or BUILD_ROOT).missing_reason
        unavailable["ggml"] = f"its libraries did not load from {libraries} ({error}); {missing or ''}".rstrip("; ")
    rows_kernel = _exo_rows_kernel(unavailable)
    generator = np.random.default_rng(0)
    results: list[KernelResult] = []
    for out_features, in_features in shapes:
        weights = (generator.standard_normal((out_features, in_features)) / np.sqrt(in_features)).astype(np.float32)
        for rows in row_counts:
            x = generator.standard_normal((rows, in_features)).astype(np.float32)
            for candidate in _candidates(weights, rows, mkl, ggml, threads, rows_kernel=rows_kernel):
                results.append(_measured(candidate, weights, x))
                _progress(f"{out_features}x{in_features} rows {rows} {candidate.name}: {results[-1].seconds:.6f} s")
    return KernelReport(
        results=results,
        unavailable=unavailable,
        commit=exo_commit(),
        cpu=f"{os.cpu_count() or 0} × {cpu_model()}",
        load_before=load_before,
        load_after=os.getloadavg(),
        command=" ".join(["uv run python -m bench.quant_kernels", *command]),
        finished_utc=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        blas=blas_description(),
        threads=threads,
    )
