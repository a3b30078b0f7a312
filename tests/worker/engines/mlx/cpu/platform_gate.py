"""The gate for tests of what only a Linux CPU machine does: they skip elsewhere (Apple silicon, CUDA), saying so."""

import pytest

from exo.worker.engines.mlx.cpu.machine import linux_cpu


def require_linux_cpu() -> None:
    """Skip the calling test unless this is a Linux CPU machine, where the CPU engine's replacements apply."""
    if not linux_cpu():
        pytest.skip("the CPU engine's replacements apply on a Linux CPU machine only")


@pytest.fixture
def linux_cpu_machine() -> None:
    require_linux_cpu()
