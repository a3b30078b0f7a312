"""Linux CPU fast path: put an optimized BLAS in front of the reference BLAS that mlx-cpu bundles.

mlx-cpu's wheel links a netlib reference BLAS (about 5 GFLOP/s for float32 matmul). libmlx resolves ``cblas_*``
symbols through the global symbol scope first, so any optimized cblas loaded ahead of it (OpenBLAS, BLIS, MKL)
takes over: about 60x faster. It has to be in place before ``mlx.core`` is first imported, which is why the runner
subprocess is started with ``LD_PRELOAD`` (see ``blas_environment``). Only float32 matmuls go through BLAS on CPU,
hence ``preferred_compute_dtype``. On macOS mlx uses Accelerate and none of this applies.
"""

import platform
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import mlx.core as mx

NO_PRELOAD_VARIABLE = "EXO_NO_BLAS_PRELOAD"
"""Set to ``1`` to start the runner without an optimized BLAS preloaded."""

LIBRARY_DIRS: tuple[Path, ...] = (
    Path("/usr/lib") / f"{platform.machine()}-linux-gnu",  # Debian/Ubuntu multiarch
    Path("/usr/lib64"),  # Fedora/RHEL
    Path("/usr/lib"),
    Path("/usr/local/lib"),
    Path("/opt/OpenBLAS/lib"),  # OpenBLAS's own `make install` default
)
"""Where ``find_optimized_blas`` looks, in order."""

OPTIMIZED_BLAS_NAMES: tuple[str, ...] = (
    # Threaded OpenBLAS first: Debian's libopenblas0-pthread, then Fedora's pthread build, then whichever variant
    # the distribution's alternatives point at.
    "openblas-pthread/libopenblas.so.0",
    "openblas-pthread/libblas.so.3",
    "libopenblasp.so.0",
    "openblas-openmp/libopenblas.so.0",
    "libopenblas.so.0",
    "blis-pthread/libblas.so.3",
    "blis-openmp/libblas.so.3",
    "libblis.so.4",
    "libmkl_rt.so.2",
    "libmkl_rt.so",
)
"""Library files (relative to a library dir) that provide an optimized cblas, most preferred first.

A bare ``libblas.so.3`` is deliberately absent: it may be the same reference BLAS mlx already has.
"""


def _on_linux() -> bool:
    return sys.platform.startswith("linux")


def find_optimized_blas() -> Path | None:
    """The first optimized BLAS library installed on this Linux machine; None on macOS or when there is none."""
    if not _on_linux():
        return None
    for directory in LIBRARY_DIRS:
        for name in OPTIMIZED_BLAS_NAMES:
            candidate = directory / name
            if candidate.is_file():
                return candidate
    return None


def blas_environment(base_env: Mapping[str, str]) -> dict[str, str]:
    """Environment for spawning the runner: ``base_env`` plus the optimized BLAS appended to ``LD_PRELOAD``.

    Unchanged on macOS, when no optimized BLAS is installed, or when ``EXO_NO_BLAS_PRELOAD=1``. An existing
    ``LD_PRELOAD`` is kept and comes first, so a library the user preloads on purpose still wins.
    """
    environment = dict(base_env)
    if environment.get(NO_PRELOAD_VARIABLE) == "1":
        return environment
    library = find_optimized_blas()
    if library is None:
        return environment
    preloaded = environment.get("LD_PRELOAD", "").replace(" ", ":").split(":")
    entries = [entry for entry in preloaded if entry]
    if str(library) not in entries:
        entries.append(str(library))
    environment["LD_PRELOAD"] = ":".join(entries)
    return environment


def blas_advice() -> str | None:
    """A one-line install hint for the log when this is Linux and no optimized BLAS was found; otherwise None."""
    if not _on_linux() or find_optimized_blas() is not None:
        return None
    return (
        "No optimized BLAS found: float32 matmuls run on mlx's bundled reference BLAS (~5 GFLOP/s). "
        "Install OpenBLAS for ~60x faster prompt processing: `apt-get install libopenblas0-pthread` "
        "(Debian/Ubuntu) or `dnf install openblas` (Fedora)."
    )


def preferred_compute_dtype() -> mx.Dtype | None:
    """float32 when matmuls run on a Linux CPU (only float32 reaches BLAS there); None to keep the model's dtype."""
    if _on_linux() and mx.default_device().type == mx.DeviceType.cpu:
        return mx.float32
    return None


def measure_matmul_gflops(n: int = 512) -> float:
    """Float32 ``n``x``n`` matmul throughput on the CPU in GFLOP/s, timed over at least 0.2 s (a quick self-check)."""
    if n < 1:
        raise ValueError("n must be positive")
    left = mx.random.normal((n, n), dtype=mx.float32, key=mx.random.key(0))
    right = mx.random.normal((n, n), dtype=mx.float32, key=mx.random.key(1))
    mx.eval(mx.matmul(left, right, stream=mx.cpu))  # warm-up: allocation and thread start are not throughput
    repeats = 0
    start = time.perf_counter()
    elapsed = 0.0
    while repeats < 3 or elapsed < 0.2:
        mx.eval(mx.matmul(left, right, stream=mx.cpu))
        repeats += 1
        elapsed = time.perf_counter() - start
    return 2 * n**3 * repeats / elapsed / 1e9
