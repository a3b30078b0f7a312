"""`--cpu-weights auto` on this machine: the quantized path (a model's kept GGUF, else Q8_0) where the CPU
replacements apply and ggml's CPU library is found, else float32 with a note naming the command that builds ggml.
Never imports mlx: the node process and `exo models` resolve it for their memory figures, a runner for its model."""

from exo.shared.types.cpu_kernels import CpuKernelsSetting, CpuWeightsSetting, NodeCpuWeights, resolve_node_weights
from exo.worker.engines.mlx.cpu.ggml_locate import find_ggml_library, ggml_missing_reason
from exo.worker.engines.mlx.cpu.switch import why_off


def node_weights(setting: CpuWeightsSetting, cpu_kernels: CpuKernelsSetting) -> NodeCpuWeights:
    """How a node on this machine started with `--cpu-weights setting --cpu-kernels cpu_kernels` holds weights."""
    applies = why_off(cpu_kernels) is None
    return resolve_node_weights(setting, applies=applies, ggml_found=applies and find_ggml_library() is not None)


def quantized_off_note() -> str:
    """What `auto` says where the quantized path would apply but ggml's library is not found."""
    return f"quantized weights off (--cpu-weights auto holds float32): {ggml_missing_reason()}"


def auto_fallback_note(setting: CpuWeightsSetting, cpu_kernels: CpuKernelsSetting) -> str | None:
    """The note where `setting` is `auto`, the replacements apply and no ggml library is found; else None."""
    if setting != "auto" or why_off(cpu_kernels) is not None or find_ggml_library() is not None:
        return None
    return quantized_off_note()
