"""The CPU engine's replacements of mlx and mlx-lm internals, the one setting that governs them, and what a runner
reports about them (its ready line and /state). See worker/engines/mlx/cpu/."""

from typing import Literal, get_args

from exo.shared.types.common import FrozenModel

CpuKernelsSetting = Literal["auto", "off"]
"""`auto`: every replacement on a Linux CPU machine, none elsewhere; `off`: none anywhere (stock mlx-lm)."""

CpuWeights = Literal["float32", "int8", "q8_0", "gguf"]
"""What the CPU engine holds the weights as where its replacements apply: `float32`, every matrix expanded (float32
BLAS); `int8`, one byte a weight with a float32 scale per output row (MKL's integer GEMM;
`engines/mlx/cpu/int8_layers.py`); `q8_0`, ggml's Q8_0 blocks (a float16 scale and 32 int8 values, 34 bytes per 32
weights) multiplied by ggml's block kernels (`engines/mlx/cpu/q8_layers.py`; needs the ggml library); or `gguf`, the
blocks of the GGUF the model was imported from, each tensor in its own type (Q4_K, Q5_0, Q6_K...), through the same
kernels (`engines/mlx/cpu/gguf_layers.py`; needs the ggml library and the kept GGUF)."""

CpuWeightsSetting = Literal["auto", "float32", "int8", "q8_0", "gguf"]
"""`--cpu-weights`: one of `CpuWeights`, or `auto` (the command line's default): the fastest this machine has, decided
once the node knows whether ggml's CPU library is built (`resolve_node_weights`) and each model whether it kept its
GGUF (`resolve_model_weights`)."""

NodeCpuWeights = Literal["float32", "int8", "q8_0", "gguf", "gguf_or_q8_0"]
"""A node's `--cpu-weights` with `auto` resolved for the machine (what its facts report and placement plans with):
`gguf_or_q8_0` is `auto` where ggml's library was found: each model's kept GGUF, else Q8_0."""

DEFAULT_CPU_WEIGHTS: CpuWeightsSetting = "auto"
"""The command line's default (`exo`, `exo models`). Code that starts a node or runner itself holds float32 unless it
says otherwise (`NodeConfig`, `RunnerConfig`)."""


def resolve_node_weights(setting: CpuWeightsSetting, *, applies: bool, ggml_found: bool) -> NodeCpuWeights:
    """`setting` on a node where the CPU replacements do or do not apply and ggml's library is or is not found: an
    explicit format as given (q8_0 and gguf still refuse to load without ggml); `auto`, the quantized path where it
    applies and ggml is found, else float32 (elsewhere, Metal or `--cpu-kernels off`, the format changes nothing)."""
    if setting != "auto":
        return setting
    return "gguf_or_q8_0" if applies and ggml_found else "float32"


def resolve_model_weights(weights: NodeCpuWeights, *, gguf_kept: bool) -> CpuWeights:
    """What a runner of a node holding `weights` holds one model as: `gguf_or_q8_0` is the model's GGUF where its
    import kept it, else Q8_0."""
    if weights == "gguf_or_q8_0":
        return "gguf" if gguf_kept else "q8_0"
    return weights


Replacement = Literal[
    "float32",
    "int8_weights",
    "q8_0_weights",
    "gguf_weights",
    "numpy_attention",
    "numpy_swiglu",
    "matmul_plan",
    "blas_preload",
    "decode_graph",
    "layer_graph",
    "repacked_blocks",
    "rows_kernel",
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
    "decode_graph": "decode steps as one ggml graph",
    "layer_graph": "prefill and verification passes as one ggml graph a layer",
    "repacked_blocks": "GGUF blocks interleaved for ggml's CPU kernels (CPU_REPACK)",
    "rows_kernel": "exo's Q8_0/Q5_0 products, Q4_K repacked and Q6_K packed (AVX-512: one row to a prefill piece)",
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
    # What the runner holds the weights as (`--cpu-weights`, with `auto` resolved for this machine and model).
    weights: CpuWeights = "float32"
    # `--cpu-weights` as the runner was started with (`auto` or the format itself).
    weights_setting: CpuWeightsSetting = "float32"
    # Why `auto` holds float32 where the quantized path would apply (no ggml library), with the command that builds it.
    weights_note: str | None = None

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
        if self.weights_note is not None:
            parts.append(self.weights_note)
        return f"{self.setting}: " + "; ".join(parts)
