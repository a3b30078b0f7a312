"""The runner's side of the one setting: which replacements this runner uses, applying them to a loaded model, and
the report its ready line and /state show."""

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final, cast

import mlx.core as mx
from mlx import nn
from mlx.utils import tree_flatten
from mlx_lm.utils import dequantize_model

from exo.models.catalog import CATALOG
from exo.models.errors import ModelLoadError
from exo.models.gguf_source import gguf_missing_reason, kept_gguf, read_gguf_source
from exo.shared.types.cpu_kernels import (
    REPLACEMENTS,
    CpuKernelsReport,
    CpuKernelsSetting,
    CpuWeights,
    CpuWeightsSetting,
    Replacement,
    ReplacementState,
    resolve_model_weights,
    resolve_node_weights,
)
from exo.worker.engines.mlx.cpu.blas import find_pypi_mkl
from exo.worker.engines.mlx.cpu.core_share import core_share
from exo.worker.engines.mlx.cpu.decode_graph import decode_graph_for, install_decode_graph
from exo.worker.engines.mlx.cpu.ggml_library import Ggml
from exo.worker.engines.mlx.cpu.ggml_locate import find_ggml_library, ggml_missing_reason
from exo.worker.engines.mlx.cpu.ggml_repack import RepackPolicy, ggml_repack
from exo.worker.engines.mlx.cpu.gguf_layers import (
    GgufModelSource,
    file_embedding_bytes,
    load_gguf_matrices,
    packed_matrices,
)
from exo.worker.engines.mlx.cpu.int8_layers import int8_bytes, quantize_model
from exo.worker.engines.mlx.cpu.kernels import use_numpy_kernels
from exo.worker.engines.mlx.cpu.layer_graph import install_layer_passes
from exo.worker.engines.mlx.cpu.q8_layers import ggml_library, q8_bytes, quantize_model_q8
from exo.worker.engines.mlx.cpu.rows_kernel import RowsKernel, rows_kernel, rows_kernel_missing_reason
from exo.worker.engines.mlx.cpu.signatures import MISMATCHES
from exo.worker.engines.mlx.cpu.switch import preload_state, why_off
from exo.worker.engines.mlx.cpu.weights_choice import quantized_off_note

DECODE_GRAPH_VARIABLE = "EXO_DECODE_GRAPH"
"""`off` keeps decode steps in mlx-lm's model with ggml's products inside (for comparison): by default
they run as one ggml graph (`decode_graph.py`)."""
REPACK_VARIABLE = "EXO_GGML_REPACK"
"""Which of a GGUF layer's matrices are held interleaved for ggml's kernels, as llama.cpp holds them
(`ggml_repack.py`; ggml repacks Q4_0, Q4_K and IQ4_NL with AVX2 on x86). By default those of a type measured to pay:
Q4_0, whose repacked kernels were faster at every row count, and Q4_K, read back into the stored blocks for passes
over many rows (a decode step of the 1.5B, mostly Q4_K, 34-37 ms against 41-44 as stored; a 512-token piece at
134-146 tok/s read back against 142-158 stored, 95-99 through the repacked kernels). `on`: every matrix ggml
repacks; `off`: none."""
REPACK_SETTINGS: Final[dict[str, RepackPolicy]] = {"on": "all", "off": "none"}
"""`EXO_GGML_REPACK`'s values other than the default (`measured`)."""
LAYER_GRAPH_VARIABLE = "EXO_LAYER_GRAPH"
"""`off` keeps multi-token passes (prefill, verification) in mlx-lm's layers with ggml's products inside (for
comparison): by default each layer's runs as one ggml graph (`layer_graph.py`)."""


class CpuKernels:
    """The replacements of one runner, decided from the setting, the machine and mlx-lm's signatures; the model's
    dtype and the runner's flags turn some off later (`prepare_model`, `allow_matmul_plan`)."""

    def __init__(
        self,
        setting: CpuKernelsSetting = "auto",
        environment: Mapping[str, str] | None = None,
        weights: CpuWeightsSetting = "float32",
        model_path: Path | None = None,
    ) -> None:
        """`weights` `auto` is resolved here, once, for this machine and the model at `model_path` (whether its
        import kept its GGUF): the report then says what the runner holds, and why float32 where ggml is missing."""
        self.setting: CpuKernelsSetting = setting
        gate = why_off(setting)
        self.weights_setting: CpuWeightsSetting = weights
        self.weights_note: str | None = None
        if weights == "auto":
            weights, self.weights_note = _resolve_auto(applies=gate is None, model_path=model_path)
        self.weights: CpuWeights = weights
        self._why_off: dict[Replacement, str | None] = {name: gate or MISMATCHES.get(name) for name in REPLACEMENTS}
        preload = preload_state(setting, os.environ if environment is None else environment)
        self._why_off["blas_preload"] = preload.why_off
        self._ggml_dir: Path | None = None
        self._ggml_missing: str | None = None
        self._packed = False
        """Whether the load packed any matrix into the kernel's own layout (`_packed_layout`)."""
        chosen = f"--cpu-weights {weights}" if self.weights_setting != "auto" else f"--cpu-weights auto ({weights})"
        variables = os.environ if environment is None else environment
        if weights not in ("q8_0", "gguf"):
            self._turn_off(("decode_graph", "layer_graph", "rows_kernel"), chosen)
        if weights != "gguf":
            self._turn_off(("repacked_blocks",), chosen)
        graph_variables: tuple[tuple[Replacement, str], ...] = (
            ("decode_graph", DECODE_GRAPH_VARIABLE),
            ("layer_graph", LAYER_GRAPH_VARIABLE),
        )
        for name, variable in graph_variables:
            if variables.get(variable, "").strip() == "off":
                self._turn_off((name,), f"{variable}=off")
        self.repack: RepackPolicy = REPACK_SETTINGS.get(variables.get(REPACK_VARIABLE, "").strip(), "measured")
        if self.repack == "none":
            self._turn_off(("repacked_blocks",), f"{REPACK_VARIABLE}=off")
        if weights == "float32":
            self._turn_off(("int8_weights", "q8_0_weights", "gguf_weights"), chosen)
        elif weights in ("q8_0", "gguf"):
            served: Replacement = "q8_0_weights" if weights == "q8_0" else "gguf_weights"
            self._turn_off(("int8_weights", "q8_0_weights", "gguf_weights"), chosen, keep=served)
            self._ggml_dir = find_ggml_library() if gate is None else None
            if gate is None and self._ggml_dir is None:
                # Refused at load (`prepare_model`), not served as float32: the node plans memory for these blocks.
                self._ggml_missing = ggml_missing_reason()
                self._turn_off((served, "repacked_blocks", "rows_kernel"), "no ggml library")
            self._turn_off(("float32",), chosen)
        elif find_pypi_mkl() is None:
            # Without MKL's integer GEMM the weights stay float32: said in the report, not an error.
            self._turn_off(("int8_weights",), "no MKL (the mkl wheel) for its integer GEMM")
            self._turn_off(("q8_0_weights", "gguf_weights"), chosen)
        else:
            self._turn_off(("float32", "q8_0_weights", "gguf_weights"), chosen)

    @property
    def loads_lazily(self) -> bool:
        """Whether the model must be built without reading its weights: under `--cpu-weights gguf` the imported
        float16 matrices are never read (the GGUF's blocks replace them)."""
        return self.weights == "gguf" and self.on("gguf_weights")

    def on(self, name: Replacement) -> bool:
        return self._why_off[name] is None

    def prepare_model(
        self, model: nn.Module, model_path: Path | None = None, first_layer: int = 0, *, split: bool = False
    ) -> str:
        """Apply the model's replacements; returns the dtype it is served in (`native`: as stored; `int8`, `q8_0` or
        `gguf`: int8 matrices, Q8_0 blocks or the GGUF's own blocks, everything else float32). Raises ModelLoadError
        under `--cpu-weights q8_0` / `gguf` where the replacements apply but no ggml library is built, and under
        `gguf` where `model_path` kept no GGUF (`first_layer`: the first of its layers a pipeline stage numbers 0;
        `split`: the model is one rank's part of a pipeline or tensor split, whose steps pass through the others)."""
        if self._ggml_missing is not None:
            raise ModelLoadError(f"--cpu-weights {self.weights} needs ggml's CPU library: {self._ggml_missing}")
        if self._ggml_dir is not None and (self.on("gguf_weights") or self.on("q8_0_weights")):
            try:
                core_share()  # EXO_GGML_THREADS read (and refused, if malformed) at load, not at the first product
            except ValueError as error:
                raise ModelLoadError(str(error)) from error
        if self.on("gguf_weights") and self._ggml_dir is not None:
            ggml = ggml_library(self._ggml_dir)
            repack: RepackPolicy = self.repack if self.on("repacked_blocks") else "none"
            if repack != "none" and ggml_repack(ggml.library_dir) is None:
                self._turn_off(("repacked_blocks",), "not offered by this ggml build")
                repack = "none"
            packed = self._packed_layout(ggml, split=split)
            load_gguf_matrices(model, _gguf_source(model_path, first_layer), ggml, repack=repack, packed=packed)
            self._packed = packed is not None and packed_matrices(model) > 0
            model.set_dtype(mx.float32)
            use_numpy_kernels([name for name in ("numpy_attention", "numpy_swiglu") if self.on(name)])
            self._install_decode_graph(model, ggml, split=split)
            return "gguf"
        if self.on("q8_0_weights") and self._ggml_dir is not None:
            quantize_model_q8(model, ggml_library(self._ggml_dir))
            model.set_dtype(mx.float32)
            use_numpy_kernels([name for name in ("numpy_attention", "numpy_swiglu") if self.on(name)])
            self._install_decode_graph(model, ggml_library(self._ggml_dir), split=split)
            return "q8_0"
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

    def _packed_layout(self, ggml: Ggml, *, split: bool) -> RowsKernel | None:
        """exo's kernel, into whose Q6_K layout a layer's matrices are packed at load, where its products are to be
        on (as `_install_decode_graph` decides): built for this CPU, a ggml graph on, not a rank of a split model."""
        graphs = self.on("decode_graph") or self.on("layer_graph")
        return rows_kernel(ggml.library_dir) if self.on("rows_kernel") and graphs and not split else None

    def _install_decode_graph(self, model: nn.Module, ggml: Ggml, *, split: bool) -> None:
        """Run the model's decode steps, and its layers' multi-token passes, as ggml graphs where it is a model those
        graphs compute."""
        graphs: tuple[Replacement, ...] = tuple(name for name in ("decode_graph", "layer_graph") if self.on(name))
        # The multi-row products are nodes of these graphs (`rows_kernel.py` decides, as the report says here).
        rows_off = rows_kernel_missing_reason(ggml.library_dir)
        if rows_off is not None:
            self._turn_off(("rows_kernel",), rows_off)
        if not graphs:
            self._turn_off(("rows_kernel",), "no ggml graph for decode steps or passes")
            return
        if split:
            self._turn_off((*graphs, "rows_kernel"), "a rank of a split model")
            return
        step = decode_graph_for(model, ggml)
        if step is None:
            architecture = getattr(getattr(model, "args", None), "model_type", "this")
            # Matrices packed at load are multiplied by the kernel in mlx-lm's layers too: it stays on for them.
            self._turn_off(
                (*graphs, *(() if self._packed else ("rows_kernel",))),
                f"not built for a {architecture} model held this way",
            )
            return
        if self.on("decode_graph"):
            install_decode_graph(model, step)
        if self.on("layer_graph"):
            install_layer_passes(model, step)

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
        return CpuKernelsReport(
            setting=self.setting,
            replacements=states,
            weights=self.weights,
            weights_setting=self.weights_setting,
            weights_note=self.weights_note,
        )

    @property
    def ggml_dir(self) -> Path | None:
        """The folder of the ggml library the Q8_0 or GGUF layers use (None unless `--cpu-weights q8_0` / `gguf`
        applies)."""
        return self._ggml_dir

    def _turn_off(self, names: tuple[Replacement, ...], reason: str, keep: Replacement | None = None) -> None:
        for name in names:
            if self._why_off[name] is None and name != keep:
                self._why_off[name] = reason


def _resolve_auto(*, applies: bool, model_path: Path | None) -> tuple[CpuWeights, str | None]:
    """`auto` for a runner: the GGUF its model kept, else Q8_0, where the replacements apply and ggml is found; else
    float32, with the note saying why where they apply."""
    ggml_found = applies and find_ggml_library() is not None
    gguf_kept = model_path is not None and kept_gguf(model_path) is not None
    node = resolve_node_weights("auto", applies=applies, ggml_found=ggml_found)
    held = resolve_model_weights(node, gguf_kept=gguf_kept)
    return held, quantized_off_note() if applies and not ggml_found else None


def _gguf_source(model_path: Path | None, first_layer: int) -> GgufModelSource:
    """The kept GGUF of the model at `model_path`; ModelLoadError naming how to import it again where none is kept."""
    if model_path is None:
        raise ModelLoadError("--cpu-weights gguf serves a model's GGUF: the model's directory was not given")
    kept, source = kept_gguf(model_path), read_gguf_source(model_path)
    if kept is None or source is None:
        catalog_ids = tuple(entry.model_id for entry in CATALOG)
        reason = gguf_missing_reason(model_path, catalog_ids)
        raise ModelLoadError(f"--cpu-weights gguf serves the GGUF a model was imported from, but {reason}")
    return GgufModelSource(model_path, kept, source, first_layer)


def held_bytes(model: nn.Module) -> int:
    """Bytes of all of `model`'s weights as served: its mlx parameters plus its int8 matrices and scales and its
    Q8_0 or GGUF blocks, an embedding table looked up in its file included (its rows are read into the page cache,
    not held: what placement plans from the file's tensors stays an upper bound)."""
    parameters = cast(list[tuple[str, mx.array]], tree_flatten(model.parameters()))
    held = int8_bytes(model) + q8_bytes(model) + file_embedding_bytes(model)
    return sum(value.nbytes for _, value in parameters) + held
