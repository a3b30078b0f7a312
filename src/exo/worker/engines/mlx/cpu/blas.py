"""Which optimized BLAS the runner subprocess gets on Linux, and the environment that puts it in front of mlx.

mlx-cpu's wheel links a netlib reference BLAS (about 5 GFLOP/s for a float32 matmul). libmlx resolves ``cblas_*``
symbols through the global symbol scope first, so an optimized cblas preloaded into the runner (``LD_PRELOAD``)
takes over. It has to be in place before ``mlx.core`` is first imported, hence an environment for the runner's
process rather than a call inside it. The choice, fastest first by the measurements in docs/PERFORMANCE.md:

1. a system OpenBLAS (``apt-get install libopenblas0-pthread``, ``dnf install openblas``);
2. Intel MKL from the ``mkl`` wheel, which exo depends on for Linux x86_64, so no root is needed (a system MKL
   comes after it: the wheel is the version these numbers were taken with);
3. a system BLIS.

On macOS mlx uses Accelerate and nothing here applies; on Linux aarch64 without OpenBLAS the reference BLAS stays
and ``blas_advice`` says how to do better. It is one of the CPU engine's replacements: `--cpu-kernels off` (see
``switch.py``) starts runners without it.

This module never imports MLX: the node process uses it, and the node process must not load mlx. The runner
reports what it really got, measured (``blas_check``).
"""

import os
import platform
import re
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

from exo.shared.types.blas import BlasKind, BlasSource, MklThreading
from exo.shared.types.common import FrozenModel
from exo.worker.engines.mlx.cpu.machine import linux_cpu

NO_PRELOAD_VARIABLE = "EXO_NO_BLAS_PRELOAD"
"""Set to ``1`` to start the runner without an optimized BLAS preloaded."""

SEARCH_PATH_VARIABLE = "EXO_BLAS_SEARCH_PATH"
"""Folders (``:``-separated) to look for a system BLAS in instead of ``LIBRARY_DIRS``; empty means none."""

LIBRARY_DIRS: tuple[Path, ...] = (
    Path("/usr/lib") / f"{platform.machine()}-linux-gnu",  # Debian/Ubuntu multiarch
    Path("/usr/lib64"),  # Fedora/RHEL
    Path("/usr/lib"),
    Path("/usr/local/lib"),
    Path("/opt/OpenBLAS/lib"),  # OpenBLAS's own `make install` default
)
"""Where a system BLAS is looked for, in order."""

SYSTEM_LIBRARIES: tuple[tuple[BlasKind, str], ...] = (
    # Threaded OpenBLAS first: Debian's libopenblas0-pthread, Fedora's pthread build, then whichever variant the
    # distribution's alternatives point at.
    ("openblas", "openblas-pthread/libopenblas.so.0"),
    ("openblas", "openblas-pthread/libblas.so.3"),
    ("openblas", "libopenblasp.so.0"),
    ("openblas", "openblas-openmp/libopenblas.so.0"),
    ("openblas", "libopenblas.so.0"),
    ("mkl", "libmkl_rt.so.2"),
    ("mkl", "libmkl_rt.so"),
    ("blis", "blis-pthread/libblas.so.3"),
    ("blis", "blis-openmp/libblas.so.3"),
    ("blis", "libblis.so.4"),
)
"""Library files (relative to a library dir) that provide an optimized cblas, most preferred first within a kind.

A bare ``libblas.so.3`` is deliberately absent: it may be the same reference BLAS mlx already has.
"""

_PYPI_MKL_DISTRIBUTION = "mkl"
_MKL_RUNTIME = re.compile(r"libmkl_rt\.so\.\d+")
_MKL_LAYERS: tuple[MklThreading, ...] = ("GNU", "INTEL", "SEQUENTIAL", "TBB")
_KIND_MARKERS: tuple[tuple[str, BlasKind], ...] = (
    ("mkl", "mkl"),
    ("openblas", "openblas"),
    ("blis", "blis"),
    ("accelerate", "accelerate"),  # macOS: /System/Library/Frameworks/Accelerate.framework/…/libBLAS.dylib
    ("veclib", "accelerate"),
)


class BlasChoice(FrozenModel):
    """The library to preload into the runner, where it comes from and (for MKL) its threading layer."""

    kind: BlasKind
    source: BlasSource
    library: Path
    threading: MklThreading | None = None


def search_dirs(environment: Mapping[str, str]) -> tuple[Path, ...]:
    """The folders searched for a system BLAS: ``EXO_BLAS_SEARCH_PATH`` when set, else ``LIBRARY_DIRS``."""
    configured = environment.get(SEARCH_PATH_VARIABLE)
    if configured is None:
        return LIBRARY_DIRS
    return tuple(Path(entry) for entry in configured.split(os.pathsep) if entry)


def find_system_blas(kind: BlasKind, environment: Mapping[str, str]) -> Path | None:
    """The first installed system library of `kind`, or None."""
    for directory in search_dirs(environment):
        for candidate_kind, name in SYSTEM_LIBRARIES:
            candidate = directory / name
            if candidate_kind == kind and candidate.is_file():
                return candidate
    return None


def find_pypi_mkl() -> Path | None:
    """``libmkl_rt.so.N`` from the installed ``mkl`` wheel (Linux x86_64 only), or None when it is not installed."""
    if not linux_cpu() or platform.machine() != "x86_64":
        return None
    try:
        distribution = metadata.distribution(_PYPI_MKL_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None
    for file in distribution.files or []:
        if _MKL_RUNTIME.fullmatch(file.name):
            path = Path(str(distribution.locate_file(file))).resolve()
            if path.is_file():
                return path
    return None


def configured_mkl_threading(environment: Mapping[str, str]) -> MklThreading | None:
    """The valid ``MKL_THREADING_LAYER`` in `environment`, or None."""
    configured = environment.get("MKL_THREADING_LAYER", "").upper()
    return next((layer for layer in _MKL_LAYERS if layer == configured), None)


def mkl_threading(environment: Mapping[str, str]) -> MklThreading:
    """The layer MKL should use: the user's ``MKL_THREADING_LAYER`` if valid, else INTEL.

    INTEL (libiomp5, from the intel-openmp wheel that comes with mkl) measured as fast as GNU on a quiet machine
    and 4x faster on a busy one, where GNU's spinning threads wait out whole scheduler slices; see
    docs/PERFORMANCE.md. It also needs nothing from the system.
    """
    return configured_mkl_threading(environment) or "INTEL"


def choose_blas(environment: Mapping[str, str]) -> BlasChoice | None:
    """The optimized BLAS the runner should use on this machine; None on macOS, when opted out or when none exists."""
    if not linux_cpu() or environment.get(NO_PRELOAD_VARIABLE) == "1":
        return None
    openblas = find_system_blas("openblas", environment)
    if openblas is not None:
        return BlasChoice(kind="openblas", source="system", library=openblas)
    pypi_mkl = find_pypi_mkl()
    if pypi_mkl is not None:
        return BlasChoice(kind="mkl", source="pypi", library=pypi_mkl, threading=mkl_threading(environment))
    system_mkl = find_system_blas("mkl", environment)
    if system_mkl is not None:
        return BlasChoice(kind="mkl", source="system", library=system_mkl, threading=mkl_threading(environment))
    blis = find_system_blas("blis", environment)
    if blis is not None:
        return BlasChoice(kind="blis", source="system", library=blis)
    return None


def blas_environment(base_env: Mapping[str, str]) -> dict[str, str]:
    """Environment for spawning the runner: ``base_env`` plus the chosen BLAS appended to ``LD_PRELOAD``.

    Unchanged on macOS, when no optimized BLAS exists, or when ``EXO_NO_BLAS_PRELOAD=1``. An existing
    ``LD_PRELOAD`` is kept and comes first, so a library the user preloads on purpose still wins. For MKL the
    threading layer is set unless the user chose one, and the interface layer is LP64: mlx passes 32-bit ints.
    """
    environment = dict(base_env)
    choice = choose_blas(environment)
    if choice is None:
        return environment
    entries = preloaded(environment)
    if str(choice.library) not in entries:
        entries.append(str(choice.library))
    environment["LD_PRELOAD"] = ":".join(entries)
    if choice.kind == "mkl" and choice.threading is not None:
        environment["MKL_THREADING_LAYER"] = choice.threading
        environment["MKL_INTERFACE_LAYER"] = "LP64"
    return environment


def preloaded(environment: Mapping[str, str]) -> list[str]:
    """The libraries `LD_PRELOAD` names in `environment`, in order."""
    return [entry for entry in environment.get("LD_PRELOAD", "").replace(" ", ":").split(":") if entry]


def classify_library(library: Path | None) -> tuple[BlasKind, BlasSource]:
    """What a library that provides ``cblas_sgemm`` is; None means none outside mlx (its bundled reference BLAS)."""
    if library is None:
        return "reference", "bundled"
    text = str(library).lower()
    kinds: list[BlasKind] = [marked for marker, marked in _KIND_MARKERS if marker in text]
    kind: BlasKind = kinds[0] if kinds else "other"
    pypi_mkl = find_pypi_mkl()
    source: BlasSource = "pypi" if pypi_mkl is not None and library.resolve() == pypi_mkl.resolve() else "system"
    return kind, source


def blas_advice(environment: Mapping[str, str]) -> str | None:
    """A one-line hint for the log when this is Linux and no optimized BLAS will be used; otherwise None."""
    if not linux_cpu() or environment.get(NO_PRELOAD_VARIABLE) == "1" or choose_blas(environment) is not None:
        return None
    wheel_hint = (
        "the `mkl` dependency is missing (run `uv sync`), or install OpenBLAS"
        if platform.machine() == "x86_64"
        else "install OpenBLAS"
    )
    return (
        "No optimized BLAS found: float32 matmuls run on mlx's bundled reference BLAS (~5 GFLOP/s). "
        f"For ~30x faster prompt processing, {wheel_hint}: `apt-get install libopenblas0-pthread` (Debian/Ubuntu) "
        "or `dnf install openblas` (Fedora)."
    )
