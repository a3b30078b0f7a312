"""Whether this machine runs mlx on a Linux CPU: the one test that decides whether the CPU engine's replacements
apply. It never imports mlx (the node process asks too, for the BLAS preload)."""

import sys
from functools import cache
from importlib import metadata


def linux_cpu() -> bool:
    """Linux without mlx's CUDA backend installed: mlx computes on the CPU."""
    return sys.platform.startswith("linux") and not _cuda_backend_installed()


@cache
def _cuda_backend_installed() -> bool:
    """mlx's CUDA backend ships as its own distribution (`mlx-cuda`, `mlx-cuda-12`, …), found without loading mlx."""
    names = (distribution.metadata["Name"] or "" for distribution in metadata.distributions())
    return any(name.lower().replace("_", "-").startswith("mlx-cuda") for name in names)
