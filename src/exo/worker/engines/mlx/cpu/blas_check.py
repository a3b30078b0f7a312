"""The runner's BLAS self-check: which library mlx's float32 matmuls really go to, and how fast they are.

Runs inside the runner (which has mlx loaded anyway) right after start. A preload that the dynamic loader ignored
(a missing file, a wrong architecture) is not an error anywhere else, so this is where it shows: the report names
the library ``cblas_sgemm`` resolves to in the process's global scope, the same lookup libmlx's calls go through.
"""

import ctypes
import os
import time
from pathlib import Path

import mlx.core as mx

from exo.shared.types.blas import BlasReport, MklThreading
from exo.worker.engines.mlx.cpu.blas import classify_library, configured_mkl_threading

SELF_CHECK_SIZE = 512
SELF_CHECK_SECONDS = 0.15


class _DlInfo(ctypes.Structure):
    _fields_ = (
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    )


def cblas_provider() -> Path | None:
    """The shared library whose ``cblas_sgemm`` a global lookup finds; None when only mlx's own copy has one.

    mlx's bundled reference BLAS is loaded privately (RTLD_LOCAL) with libmlx, so a global lookup finds only a
    library that was preloaded (Linux) or is a global dependency (Accelerate on macOS).
    """
    process = ctypes.CDLL(None)
    try:
        symbol = process.cblas_sgemm
    except AttributeError:
        return None
    try:
        dladdr = process.dladdr
    except AttributeError:  # glibc before 2.34 keeps dladdr in libdl
        dladdr = ctypes.CDLL("libdl.so.2").dladdr
    info = _DlInfo()
    if dladdr(ctypes.cast(symbol, ctypes.c_void_p), ctypes.byref(info)) == 0 or not info.dli_fname:
        return None
    return Path(os.fsdecode(info.dli_fname))


def set_blas_threads(threads: int) -> Path | None:
    """Set the thread count of the BLAS mlx's matmuls go to (MKL or OpenBLAS), returning that library; None where
    no such library answers (mlx's own reference BLAS has no threads)."""
    provider = cblas_provider()
    if provider is None:
        return None
    library = ctypes.CDLL(str(provider))
    for name in ("MKL_Set_Num_Threads", "openblas_set_num_threads"):
        try:
            setter = getattr(library, name)
        except AttributeError:
            continue
        setter.restype, setter.argtypes = None, [ctypes.c_int]
        setter(threads)
        return provider
    return None


def measure_matmul_gflops(n: int = SELF_CHECK_SIZE, seconds: float = SELF_CHECK_SECONDS) -> float:
    """Best float32 ``n``×``n`` matmul throughput on the CPU in GFLOP/s over about `seconds` (at least 2 runs).

    The best single run, not the mean: on a shared machine another process taking a core for a moment says
    nothing about the library.
    """
    if n < 1:
        raise ValueError("n must be positive")
    left = mx.random.normal((n, n), dtype=mx.float32, key=mx.random.key(0))
    right = mx.random.normal((n, n), dtype=mx.float32, key=mx.random.key(1))
    mx.eval(left, right, mx.matmul(left, right, stream=mx.cpu))  # warm-up: allocation and thread start
    best = float("inf")
    runs = 0
    deadline = time.perf_counter() + seconds
    while runs < 2 or time.perf_counter() < deadline:
        start = time.perf_counter()
        mx.eval(mx.matmul(left, right, stream=mx.cpu))
        best = min(best, time.perf_counter() - start)
        runs += 1
    return 2 * n**3 / best / 1e9


def blas_report(n: int = SELF_CHECK_SIZE) -> BlasReport:
    """Find the BLAS this process uses and measure it."""
    library = cblas_provider()
    kind, source = classify_library(library)
    threading: MklThreading | None = None
    if kind == "mkl":
        threading = configured_mkl_threading(os.environ) or "INTEL"  # MKL's own default
    return BlasReport(
        kind=kind,
        source=source,
        library=str(library) if library is not None else None,
        threading=threading,
        matmul_gflops=round(measure_matmul_gflops(n), 1),
        matmul_size=n,
    )
