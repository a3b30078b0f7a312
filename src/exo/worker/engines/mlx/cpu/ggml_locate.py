"""Where ggml's CPU shared libraries (`libggml-base`, `libggml-cpu`) are on this machine, for the quantized CPU path.

No PyPI package ships ggml prebuilt for Linux, so exo builds it (`exo ggml build`) from the same llama.cpp release
the bench measures. The folder holding both libraries is looked up in order:

1. `$EXO_GGML_DIR`, when set (a folder of the user's own build, or CI's cache). Set but without the libraries, it is
   an error, not a reason to look elsewhere: the user asked for that build;
2. the cache `exo ggml build` writes: `$EXO_HOME/ggml/<version>/<cpu>/lib` (`cpu_key`);
3. in a source checkout, the bench's llama-server build (`build/llama-cpp/<version>/llama.cpp/build/bin`).

The build uses this CPU's instruction set (GGML_NATIVE), so a library built on one CPU may stop with an illegal
instruction on another: the cache is keyed by the CPU's architecture and feature flags, so an `$EXO_HOME` shared
between machines (a network home) holds one build per kind of CPU and never hands one CPU another's.
"""

import hashlib
import os
import platform
import sys
from pathlib import Path
from typing import Final

from exo.models.paths import exo_home
from exo.worker.engines.mlx.cpu.llama_cpp_source import LLAMA_CPP_BUILD_ROOT, VERSION, llama_server_bin_dir

GGML_DIR_VARIABLE: Final = "EXO_GGML_DIR"
GGML_BUILD_COMMAND: Final = "uv run exo ggml build"
"""What a user runs to build the libraries into the cache (named in every "not found" message)."""
_SUFFIX: Final = ".dylib" if sys.platform == "darwin" else ".so"
GGML_LIBRARIES: Final = (f"libggml-base{_SUFFIX}", f"libggml-cpu{_SUFFIX}")
"""Loaded in this order: the CPU backend needs the base library's symbols."""
_CPUINFO: Final = Path("/proc/cpuinfo")


def holds_ggml(folder: Path) -> bool:
    """Whether `folder` has both libraries."""
    return all((folder / name).is_file() for name in GGML_LIBRARIES)


def cpu_features(cpuinfo: str) -> list[str]:
    """The first processor's feature flags in /proc/cpuinfo's text (`flags` on x86, `Features` on Arm), sorted."""
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            return sorted(set(value.split()))
    return []


def cpu_key(cpuinfo: str | None = None, machine: str | None = None) -> str:
    """A name for this kind of CPU: the architecture and a digest of its feature flags (`x86_64-1a2b3c4d5e6f`).

    Every flag counts, not only the SIMD ones: a flag that changes without changing the instruction set (another
    kernel, a migrated VM) costs one rebuild, while a missed one could cost a crash."""
    if cpuinfo is None:
        try:
            cpuinfo = _CPUINFO.read_text(errors="replace")
        except OSError:
            cpuinfo = ""  # macOS, or a sandbox without /proc: the processor's name stands in
    features = cpu_features(cpuinfo) or [platform.processor() or "unknown"]
    digest = hashlib.sha256(" ".join(features).encode()).hexdigest()[:12]
    return f"{machine or platform.machine() or 'unknown'}-{digest}"


def ggml_cache_root(home: Path | None = None) -> Path:
    """Where `exo ggml build` keeps its downloads and builds: `$EXO_HOME/ggml`."""
    return (home if home is not None else exo_home()) / "ggml"


def ggml_cache_dir(root: Path | None = None, version: str = VERSION, key: str | None = None) -> Path:
    """The folder `exo ggml build` leaves the two libraries in, for this release and this kind of CPU."""
    return (root if root is not None else ggml_cache_root()) / version / (key or cpu_key()) / "lib"


def ggml_candidates(llama_cpp_root: Path = LLAMA_CPP_BUILD_ROOT) -> list[Path]:
    """The folders looked in, in order (only `$EXO_GGML_DIR` when it is set).

    The bench's llama.cpp build counts only inside a source checkout: elsewhere the path means nothing."""
    configured = os.environ.get(GGML_DIR_VARIABLE)
    if configured:
        return [Path(configured).expanduser()]
    candidates = [ggml_cache_dir()]
    if (llama_cpp_root.parent.parent / "pyproject.toml").is_file():
        candidates.append(llama_server_bin_dir(llama_cpp_root))
    return candidates


def find_ggml_library(llama_cpp_root: Path = LLAMA_CPP_BUILD_ROOT) -> Path | None:
    """The folder holding both libggml-base and libggml-cpu, or None (`ggml_missing_reason` says why)."""
    return next((folder for folder in ggml_candidates(llama_cpp_root) if holds_ggml(folder)), None)


def ggml_missing_reason(llama_cpp_root: Path = LLAMA_CPP_BUILD_ROOT) -> str:
    """Why `find_ggml_library` found nothing, naming the folders looked in and the command that builds ggml."""
    wanted = " and ".join(GGML_LIBRARIES)
    configured = os.environ.get(GGML_DIR_VARIABLE)
    if configured:
        return (
            f"{GGML_DIR_VARIABLE}={configured} has no {wanted}; point it at a folder with both, or unset it and "
            f"run `{GGML_BUILD_COMMAND}`"
        )
    looked = ", ".join(str(folder) for folder in ggml_candidates(llama_cpp_root))
    return f"ggml is not built for this machine (no {wanted} in {looked}); build it with `{GGML_BUILD_COMMAND}`"
