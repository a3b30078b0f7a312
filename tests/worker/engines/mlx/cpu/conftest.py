import pytest

from exo.worker.engines.mlx.cpu.ggml_library import Ggml
from exo.worker.engines.mlx.cpu.ggml_locate import find_ggml_library, ggml_missing_reason
from exo.worker.engines.mlx.cpu.q8_layers import ggml_library
from tests.machine_skips import skip_for_machine
from tests.worker.engines.mlx.cpu.platform_gate import linux_cpu_machine

__all__ = ["ggml", "linux_cpu_machine"]


@pytest.fixture
def ggml() -> Ggml:
    """The ggml library this machine has built (the Q8_0 and GGUF layers' tests); skips for a reason of the machine
    where there is none."""
    folder = find_ggml_library()
    if folder is None:
        skip_for_machine(ggml_missing_reason())
    return ggml_library(folder)
