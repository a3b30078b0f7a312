"""The llama.cpp build script's paths, its download command and the bench's "not built" answers, without building
(the build takes 15+ minutes; the bench, not the test suite, needs the binary). The download command and the
unpacking are tested with the source module they live in (tests/worker/engines/mlx/cpu/test_llama_cpp_source.py)."""

import os
import stat
import sys
from pathlib import Path

import pytest

from bench.llama_cpp_build import VERSION, find_llama_server, main, server_binary


def test_not_built_names_the_build_command(tmp_path: Path) -> None:
    found = find_llama_server(tmp_path)
    assert found.binary is None
    assert found.missing_reason is not None
    assert "python -m bench.llama_cpp_build" in found.missing_reason


def test_a_failed_build_is_reported_with_its_reason(tmp_path: Path) -> None:
    (tmp_path / VERSION).mkdir()
    (tmp_path / VERSION / "build-failed.txt").write_text("CalledProcessError: cmake exited with 1\n")
    found = find_llama_server(tmp_path)
    assert found.binary is None
    assert found.missing_reason is not None
    assert "cmake exited with 1" in found.missing_reason


def test_an_executable_binary_is_found(tmp_path: Path) -> None:
    binary = server_binary(tmp_path)
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    assert find_llama_server(tmp_path).binary is None  # not executable yet
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    assert find_llama_server(tmp_path) == find_llama_server(tmp_path)
    assert find_llama_server(tmp_path).binary == binary


def test_a_build_that_cannot_run_records_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no downloader on PATH the build fails, says so, and leaves the reason for the bench to print."""
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(sys, "executable", str(empty / "no-python"))
    assert main(["--root", str(tmp_path / "cache")]) == 1
    found = find_llama_server(tmp_path / "cache")
    assert found.binary is None
    assert found.missing_reason is not None
    assert "failed" in found.missing_reason
    assert os.listdir(tmp_path / "cache" / VERSION / "sdist") == []
