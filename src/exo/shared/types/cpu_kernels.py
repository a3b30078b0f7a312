"""The CPU engine's replacements of mlx and mlx-lm internals, the one setting that governs them, and what a runner
reports about them (its ready line and /state). See worker/engines/mlx/cpu/."""

from typing import Literal, get_args

from exo.shared.types.common import FrozenModel

CpuKernelsSetting = Literal["auto", "off"]
"""`auto`: every replacement on a Linux CPU machine, none elsewhere; `off`: none anywhere (stock mlx-lm)."""

CpuWeightsSetting = Literal["float32", "int8", "q8_0", "gguf"]
"""What the CPU engine holds the weights as (`--cpu-weights`; it applies where the replacements do): `float32`, every
matrix expanded (float32 BLAS); `int8`, one byte a weight with a float32 scale per output row (MKL's integer
GEMM; `engines/mlx/cpu/int8_layers.py`); or `q8_0`, ggml's Q8_0 blocks (a float16 scale and 32 int8 values, 34
bytes per 32 weights) multiplied by ggml's block kernels (`engines/mlx/cpu/q8_layers.py`; needs the ggml library);
or `gguf`, the blocks of the GGUF the model was imported from, each tensor in its own type (Q4_K, Q5_0, Q6_K...),
through the same kernels (`engines/mlx/cpu/gguf_layers.py`; needs the ggml library and the kept GGUF)."""

DEFAULT_CPU_WEIGHTS: CpuWeightsSetting = "float32"

Replacement = Literal[
    "float32",
    "int8_weights",
    "q8_0_weights",
    "gguf_weights",
    "numpy_attention",
    "numpy_swiglu",
    "matmul_plan",
    "blas_preload",
]

REPLACEMENTS: tuple[Replacement, ...] = get_args(Replacement)
"""Every replacement, in the order the runner reports them (the Literal's)."""

DESCRIPTIONS: dict[Replacement, str] = {
    "float32": "float32 weights",
    "int8_weights": "int8 weights (MKL s8u8s32)",
    "q8_0_weights": "Q8_0 weights (ggml)",
    "gguf_weights": "GGUF weights as stored (ggml)",
    "numpy_attention": "numpy attention softmax",
    "numpy_swiglu": "numpy SwiGLU",
    "matmul_plan": "few-row matmul plan",
    "blas_preload": "optimized BLAS preload",
}


class ReplacementState(FrozenModel):
    """One replacement: whether this runner uses it, and why not where it does not."""

    name: Replacement
    on: bool
    why_off: str | None = None


class CpuKernelsReport(FrozenModel):
    """The setting a runner was started with and the state of each replacement in it."""

    setting: CpuKernelsSetting
    replacements: tuple[ReplacementState, ...]
    # `--cpu-weights`, as the runner was started with (the replacements say what it holds).
    weights: CpuWeightsSetting = DEFAULT_CPU_WEIGHTS

    def describe(self) -> str:
        """One line for the log: `auto: on: float32 weights, …; off: numpy SwiGLU (mlx-lm's swiglu is (x), …)`."""
        on = [DESCRIPTIONS[state.name] for state in self.replacements if state.on]
        off = [state for state in self.replacements if not state.on]
        reasons = {state.why_off for state in off}
        if not on and len(reasons) == 1:
            return f"{self.setting}: all off ({reasons.pop()}): stock mlx-lm"
        parts = [f"on: {', '.join(on)}"] if on else []
        if off:
            parts.append("off: " + ", ".join(f"{DESCRIPTIONS[state.name]} ({state.why_off})" for state in off))
        return f"{self.setting}: " + "; ".join(parts)
