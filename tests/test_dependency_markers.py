"""The lock resolves per platform as meant: the PyPI MKL on Linux x86_64 only; macOS and aarch64 get none of it.

Checked by asking uv what it would install from the committed lock for each target platform (`uv sync --frozen
--dry-run --python-platform`), offline and without creating an environment.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
MKL_PACKAGES = {"mkl", "intel-openmp", "tbb"}
_PLANNED = re.compile(r"^ \+ (?P<name>[A-Za-z0-9._-]+)==", re.MULTILINE)


def _planned_packages(python_platform: str, tmp_path: Path) -> set[str]:
    uv = os.environ.get("UV") or shutil.which("uv")
    assert uv is not None, "uv sets up this project (README); it must be on PATH"
    environment = {
        **os.environ,
        "UV_PROJECT_ENVIRONMENT": str(tmp_path / "environment"),
        "MACOSX_DEPLOYMENT_TARGET": "14.0",  # mlx's macOS wheels start at 14
    }
    completed = subprocess.run(
        [uv, "sync", "--frozen", "--offline", "--dry-run", "--python-platform", python_platform],
        cwd=REPOSITORY_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert not (tmp_path / "environment").exists()  # a dry run creates nothing
    return {match["name"].lower() for match in _PLANNED.finditer(completed.stderr + completed.stdout)}


def test_linux_x86_64_gets_the_pypi_mkl(tmp_path: Path) -> None:
    planned = _planned_packages("x86_64-manylinux_2_35", tmp_path)
    assert planned >= MKL_PACKAGES
    assert planned >= {"mlx", "mlx-cpu"}


@pytest.mark.parametrize("python_platform", ["aarch64-apple-darwin", "aarch64-manylinux_2_35"])
def test_macos_and_aarch64_get_no_mkl(python_platform: str, tmp_path: Path) -> None:
    planned = _planned_packages(python_platform, tmp_path)
    assert "mlx" in planned  # the resolution worked and is for exo
    assert not planned & MKL_PACKAGES
    assert ("mlx-metal" in planned) == python_platform.endswith("darwin")
