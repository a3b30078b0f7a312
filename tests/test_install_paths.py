"""The install paths README and OPERATIONS.md give: mlx's CPU build by default on Linux, its CUDA builds instead on
an NVIDIA machine. Checked against uv.lock with uv itself, offline (a dry run plans, installs nothing)."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _uv_run(*arguments: str) -> subprocess.CompletedProcess[str]:
    uv = shutil.which("uv")
    assert uv is not None, "the README's commands run under uv"
    return subprocess.run([uv, *arguments], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


def _uv(*arguments: str) -> str:
    completed = _uv_run(*arguments)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return completed.stdout + completed.stderr


def test_the_lock_matches_pyproject() -> None:
    _uv("lock", "--check", "--offline")


def test_the_default_environment_holds_mlxs_cpu_build() -> None:
    plan = _uv("sync", "--dry-run", "--offline", "--locked")
    assert "mlx-cuda" not in plan
    assert (ROOT / ".venv").exists()
    installed = _uv("pip", "list", "--offline")
    assert "mlx-cpu" in installed
    assert "mlx-cuda" not in installed


@pytest.mark.parametrize(("group", "backend"), [("cuda12", "mlx-cuda-12"), ("cuda13", "mlx-cuda-13")])
def test_a_cuda_group_swaps_the_cpu_build_for_a_cuda_build(group: str, backend: str) -> None:
    plan = _uv("sync", "--dry-run", "--offline", "--locked", "--no-group", "cpu", "--group", group)
    assert "- mlx-cpu==" in plan
    assert f"+ {backend}==" in plan
    assert "+ nvidia-cublas" in plan


def test_the_cpu_and_cuda_builds_are_never_installed_together() -> None:
    completed = _uv_run("sync", "--dry-run", "--offline", "--locked", "--group", "cuda13")
    assert completed.returncode != 0
    assert "conflict" in (completed.stdout + completed.stderr).lower()
