"""Which MLX backend this machine's runners use, and so how a node here holds weights: read from the platform and
the installed MLX wheels, never by importing MLX (the API process and `exo models` never load it)."""

import importlib.metadata
import platform
import sys
from functools import cache

from exo.shared.types.cpu_kernels import CpuKernelsSetting, NodeCpuWeights
from exo.shared.types.footprint import WeightsInMemory, weights_in_memory
from exo.shared.types.state import MlxBackend


@cache  # reading every installed wheel's metadata takes a fifth of a second, and the wheels stay as they are
def mlx_backend() -> MlxBackend:
    """Metal on Apple silicon, CUDA where an mlx-cuda wheel is installed, else the CPU backend."""
    if sys.platform == "darwin" and platform.machine() == "arm64":
        return "metal"
    installed = {(distribution.metadata["Name"] or "").lower() for distribution in importlib.metadata.distributions()}
    return "cuda" if any(name.startswith("mlx-cuda") for name in installed) else "cpu"


def local_weights_in_memory(
    cpu_kernels: CpuKernelsSetting = "auto", cpu_weights: NodeCpuWeights = "float32"
) -> WeightsInMemory:
    """How a node on this machine started with these settings holds weights (what its memory figures are for);
    `cpu_weights` with `auto` resolved (`engines/mlx/cpu/weights_choice.node_weights`)."""
    return weights_in_memory(mlx_backend(), cpu_kernels, cpu_weights)
