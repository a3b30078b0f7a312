"""The install paths README and OPERATIONS.md give: mlx's CPU build by default on Linux, its CUDA builds instead on
an NVIDIA machine. Checked against uv.lock with uv itself, offline (a dry run plans, installs nothing), from whichever
of the builds this environment holds now."""

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


def _after_sync(*options: str) -> set[str]:
    """The distributions the environment would hold after `uv sync OPTIONS`: those installed now, less the plan's
    removals, plus its additions."""
    listed = _uv("pip", "list", "--offline", "--format", "freeze").splitlines()
    held = {line.split("==")[0].lower() for line in listed if "==" in line}
    for line in _uv("sync", "--dry-run", "--offline", "--locked", *options).splitlines():
        change = line.strip()
        if change[:2] in {"- ", "+ "}:
            name = change[2:].split("==")[0].lower()
            (held.discard if change[0] == "-" else held.add)(name)
    return held


def test_the_lock_matches_pyproject() -> None:
    _uv("lock", "--check", "--offline")


def test_the_default_environment_holds_mlxs_cpu_build() -> None:
    held = _after_sync()
    assert "mlx-cpu" in held
    assert not any(name.startswith("mlx-cuda") for name in held)


@pytest.mark.parametrize(("group", "backend"), [("cuda12", "mlx-cuda-12"), ("cuda13", "mlx-cuda-13")])
def test_a_cuda_group_swaps_the_cpu_build_for_a_cuda_build(group: str, backend: str) -> None:
    held = _after_sync("--no-group", "cpu", "--group", group)
    assert backend in held
    assert "mlx-cpu" not in held
    assert {name for name in held if name.startswith("mlx-cuda")} == {backend}
    assert any(name.startswith("nvidia-cublas") for name in held)


def test_the_cpu_and_cuda_builds_are_never_installed_together() -> None:
    completed = _uv_run("sync", "--dry-run", "--offline", "--locked", "--group", "cuda13")
    assert completed.returncode != 0
    assert "conflict" in (completed.stdout + completed.stderr).lower()
