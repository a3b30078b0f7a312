"""The one setting: whether the CPU engine's replacements apply in this process, and the BLAS preload's own state.
Never imports mlx (the node process decides the BLAS preload before any runner starts)."""

from collections.abc import Mapping

from exo.shared.types.cpu_kernels import CpuKernelsSetting, ReplacementState
from exo.worker.engines.mlx.cpu.blas import NO_PRELOAD_VARIABLE, choose_blas, preloaded
from exo.worker.engines.mlx.cpu.machine import linux_cpu


def why_off(setting: CpuKernelsSetting) -> str | None:
    """Why every replacement is off under `setting` on this machine, or None where they apply."""
    if setting == "off":
        return "--cpu-kernels off"
    if not linux_cpu():
        return "not a Linux CPU machine"
    return None


def preload_state(setting: CpuKernelsSetting, environment: Mapping[str, str]) -> ReplacementState:
    """Whether the process started with `environment` had the optimized BLAS preloaded (the node sets it up for its
    runners under `auto`; a process started otherwise, a benchmark's say, may not have it)."""
    reason = why_off(setting)
    choice = choose_blas(environment)
    if reason is None and environment.get(NO_PRELOAD_VARIABLE) == "1":
        reason = f"{NO_PRELOAD_VARIABLE}=1"
    elif reason is None and choice is None:
        reason = "no optimized BLAS found"
    elif reason is None and choice is not None and str(choice.library) not in preloaded(environment):
        reason = "not in LD_PRELOAD"
    return ReplacementState(name="blas_preload", on=reason is None, why_off=reason)
