"""The runner's side of the one setting: which replacements this runner uses, applying them to a loaded model, and
the report its ready line and /state show."""

import os
from collections.abc import Mapping
from typing import cast

import mlx.core as mx
from mlx import nn
from mlx.utils import tree_flatten
from mlx_lm.utils import dequantize_model

from exo.shared.types.cpu_kernels import (
    DEFAULT_CPU_WEIGHTS,
    REPLACEMENTS,
    CpuKernelsReport,
    CpuKernelsSetting,
    CpuWeightsSetting,
    Replacement,
    ReplacementState,
)
from exo.worker.engines.mlx.cpu.blas import find_pypi_mkl
from exo.worker.engines.mlx.cpu.int8_layers import quantize_model
from exo.worker.engines.mlx.cpu.kernels import use_numpy_kernels
from exo.worker.engines.mlx.cpu.signatures import MISMATCHES
from exo.worker.engines.mlx.cpu.switch import preload_state, why_off


class CpuKernels:
    """The replacements of one runner, decided from the setting, the machine and mlx-lm's signatures; the model's
    dtype and the runner's flags turn some off later (`prepare_model`, `allow_matmul_plan`)."""

    def __init__(
        self,
        setting: CpuKernelsSetting = "auto",
        environment: Mapping[str, str] | None = None,
        weights: CpuWeightsSetting = DEFAULT_CPU_WEIGHTS,
    ) -> None:
        self.setting: CpuKernelsSetting = setting
        self.weights: CpuWeightsSetting = weights
        gate = why_off(setting)
        self._why_off: dict[Replacement, str | None] = {name: gate or MISMATCHES.get(name) for name in REPLACEMENTS}
        preload = preload_state(setting, os.environ if environment is None else environment)
        self._why_off["blas_preload"] = preload.why_off
        if weights == "float32":
            self._turn_off(("int8_weights",), "--cpu-weights float32")
        elif find_pypi_mkl() is None:
            # Without MKL's integer GEMM the weights stay float32: said in the report, not an error.
            self._turn_off(("int8_weights",), "no MKL (the mkl wheel) for its integer GEMM")
        else:
            self._turn_off(("float32",), "--cpu-weights int8")

    def on(self, name: Replacement) -> bool:
        return self._why_off[name] is None

    def prepare_model(self, model: nn.Module) -> str:
        """Apply the model's replacements; returns the dtype it is served in (`native`: as stored; `int8`: int8
        matrices, everything else float32)."""
        if self.on("int8_weights"):
            # One matrix at a time, before anything else is expanded: loading never holds the model in float32.
            quantize_model(model)
            model.set_dtype(mx.float32)
            use_numpy_kernels([name for name in ("numpy_attention", "numpy_swiglu") if self.on(name)])
            return "int8"
        if not self.on("float32"):
            self._turn_off(("numpy_attention", "numpy_swiglu"), "weights not float32")
            return "native"
        # On a CPU only float32 matmuls reach the optimized BLAS; quantized and half types run far slower.
        if any("scales" in name for name, _ in cast(list[tuple[str, mx.array]], tree_flatten(model.parameters()))):
            model = dequantize_model(model)
        model.set_dtype(mx.float32)
        use_numpy_kernels([name for name in ("numpy_attention", "numpy_swiglu") if self.on(name)])
        return "float32"

    def allow_matmul_plan(self, requested: bool, dtype: str) -> bool:
        """Whether to plan decoding's few-row products: asked for (`--no-matmul-plan` not given), weights in float32
        (only those reach a BLAS's few-row kernels), and not turned off here."""
        if not requested:
            self._turn_off(("matmul_plan",), "--no-matmul-plan")
        elif dtype != "float32":
            self._turn_off(("matmul_plan",), "weights not float32")
        return self.on("matmul_plan")

    def report(self) -> CpuKernelsReport:
        states = tuple(
            ReplacementState(name=name, on=reason is None, why_off=reason) for name, reason in self._why_off.items()
        )
        return CpuKernelsReport(setting=self.setting, replacements=states, weights=self.weights)

    def _turn_off(self, names: tuple[Replacement, ...], reason: str) -> None:
        for name in names:
            if self._why_off[name] is None:
                self._why_off[name] = reason
