"""What a model's weights take in memory, layer by layer: what placement plans a pipeline with."""

from typing import Literal

from pydantic import model_validator

from exo.shared.types.common import FrozenModel
from exo.shared.types.cpu_kernels import CpuKernelsSetting, NodeCpuWeights, resolve_model_weights

WeightsInMemory = Literal["stored", "float32", "int8", "q8_0", "gguf", "gguf_or_q8_0"]
"""How a runner holds the weights: as the checkpoint stores them, expanded to float32 (a Linux CPU's float32
engine), as int8 with per-row scales (`--cpu-weights int8`), as ggml's Q8_0 blocks (`--cpu-weights q8_0`), or as the
blocks of the GGUF the model was imported from (`--cpu-weights gguf`: the file's tensor bytes). `gguf_or_q8_0` is a
node's `--cpu-weights auto` with ggml found: each model is held as its kept GGUF, else as Q8_0 (`held_as` resolves it
for one model)."""

INT8_OVERHEAD = 1 / 32
"""Beyond one byte a parameter: each matrix's float32 scale per output row (4 bytes per row of at least 128 weights
in any real model) and the norms and biases kept in float32."""
Q8_0_BYTES_PER_WEIGHT = 34 / 32
"""A Q8_0 block: a float16 scale and 32 int8 values for 32 weights. The norms and biases kept in float32 are a few
thousandths of a model's parameters (the default model: 0.05 %), within the rounding of this figure."""


def weights_in_memory(mlx_backend: str, cpu_kernels: CpuKernelsSetting, cpu_weights: NodeCpuWeights) -> WeightsInMemory:
    """How a node's runners hold weights: converted by the CPU engine (to float32, or int8 / Q8_0 / the GGUF's blocks
    under `--cpu-weights int8` / `q8_0` / `gguf`) on the CPU backend unless the node runs `--cpu-kernels off`; else
    as the checkpoint stores them (Metal and CUDA keep an mlx-community 4/8-bit checkpoint quantized)."""
    if mlx_backend == "cpu" and cpu_kernels == "auto":
        return cpu_weights
    return "stored"


def held_as(weights: WeightsInMemory, *, gguf_kept: bool) -> WeightsInMemory:
    """How one model is held on a node holding `weights`: `gguf_or_q8_0` as its GGUF where its import kept one, else
    as Q8_0 (what that node's runner resolves `--cpu-weights auto` to); any other as it is."""
    return weights if weights == "stored" else resolve_model_weights(weights, gguf_kept=gguf_kept)


def held_bytes(parameters: int, stored_bytes: int, *, weights: WeightsInMemory) -> int:
    """Memory `parameters` weights (`stored_bytes` in their files) take once loaded: the one computation behind every
    memory figure exo shows (the catalog, `exo models`, /v1/models, placement, the dashboard).

    4 bytes a parameter in float32, about one as int8 (plus INT8_OVERHEAD for scales and norms), 34 bytes per 32
    as Q8_0, else `stored_bytes`: under gguf the caller passes the GGUF's tensor bytes where it knows them
    (`ModelFootprint.gguf_bytes`), the imported files' bytes otherwise (a model without a kept GGUF is refused under
    gguf; planning it so never under-counts). `gguf_or_q8_0` is resolved for the model first (`held_as`); a caller
    that cannot gets Q8_0's figure.
    """
    if weights == "float32":
        return 4 * parameters
    if weights in ("q8_0", "gguf_or_q8_0"):
        return int(parameters * Q8_0_BYTES_PER_WEIGHT)
    if weights == "int8":
        return int(parameters * (1 + INT8_OVERHEAD))
    return stored_bytes


class ModelFootprint(FrozenModel):
    """Parameter counts and checkpoint bytes, per layer and for the weights outside any layer.

    Every pipeline rank holds the shared weights (embeddings, final norm, output head) and its own layers.
    """

    layer_parameters: tuple[int, ...]
    shared_parameters: int
    layer_file_bytes: tuple[int, ...]
    shared_file_bytes: int
    # What a tensor split divides among its ranks (from config.json; None where the config does not say).
    attention_heads: int | None = None
    kv_heads: int | None = None
    mlp_width: int | None = None
    # The width of the hidden state each layer passes on (config.json's hidden_size): what a tensor split's all-sums
    # and a pipeline's hops carry per token. None where the config does not say.
    hidden_size: int | None = None
    # The bytes of the kept GGUF's tensors (`exo.models.gguf_source`), per layer and outside any layer: what the
    # weights take under `--cpu-weights gguf`. None where the model kept no GGUF.
    layer_gguf_bytes: tuple[int, ...] | None = None
    shared_gguf_bytes: int | None = None

    @model_validator(mode="after")
    def _check(self) -> "ModelFootprint":
        if len(self.layer_parameters) != len(self.layer_file_bytes) or not self.layer_parameters:
            raise ValueError("a footprint needs parameter and byte counts for every layer, and at least one layer")
        return self

    @property
    def num_layers(self) -> int:
        return len(self.layer_parameters)

    @property
    def gguf_kept(self) -> bool:
        return self.layer_gguf_bytes is not None and self.shared_gguf_bytes is not None

    def held_as(self, weights: WeightsInMemory) -> WeightsInMemory:
        """How a node holding `weights` holds this model (`footprint.held_as`)."""
        return held_as(weights, gguf_kept=self.gguf_kept)

    def rank_bytes(self, start: int, end: int, *, weights: WeightsInMemory) -> int:
        """Memory for the shared weights plus layers [start, end) held as `weights` (`held_bytes`)."""
        weights = self.held_as(weights)
        parameters = self.shared_parameters + sum(self.layer_parameters[start:end])
        stored = self.shared_file_bytes + sum(self.layer_file_bytes[start:end])
        if weights == "gguf" and self.layer_gguf_bytes is not None and self.shared_gguf_bytes is not None:
            stored = self.shared_gguf_bytes + sum(self.layer_gguf_bytes[start:end])
        return held_bytes(parameters, stored, weights=weights)

    def total_bytes(self, *, weights: WeightsInMemory) -> int:
        return self.rank_bytes(0, self.num_layers, weights=weights)

    def tensor_rank_bytes(self, world_size: int, *, weights: WeightsInMemory) -> int:
        """Memory for one rank of a tensor split over `world_size`: the shared weights whole (embeddings, final norm
        and output head are not split) and 1/`world_size` of every layer (its norms, a few thousand values, count
        as split too). The split matrices are mlx's sharded linear layers: under q8_0 each rank holds its slice as
        Q8_0 blocks like any matrix; under gguf its slice of the file's blocks, or of a matrix whose column slices do
        not fall on the file's blocks (a K-quant's 256) that slice re-quantized to Q8_0, so a gguf rank is planned at
        the larger of the two; the int8 conversion leaves them alone (its layers are held in float32)."""
        weights = self.held_as(weights)
        shared = self.rank_bytes(0, 0, weights=weights)
        layer_weights: tuple[WeightsInMemory, ...] = (weights,)
        if weights == "int8":
            layer_weights = ("float32",)
        elif weights == "gguf":
            layer_weights = ("gguf", "q8_0")
        layers = max(self.total_bytes(weights=held) - self.rank_bytes(0, 0, weights=held) for held in layer_weights)
        return shared + -(-layers // world_size)

    def tensor_split_refusal(self, world_size: int) -> str | None:
        """Why the model's layers cannot be split by matrices over `world_size` ranks (None when they can): every
        rank takes the same number of attention heads, KV heads and MLP columns."""
        counts = {"attention heads": self.attention_heads, "KV heads": self.kv_heads, "MLP width": self.mlp_width}
        unknown = [name for name, count in counts.items() if count is None]
        if unknown:
            return f"its config.json does not give its {', '.join(unknown)}"
        named = ", ".join(f"{name} {count}" for name, count in counts.items())
        indivisible = [name for name, count in counts.items() if count is not None and count % world_size]
        if indivisible:
            return f"{' and '.join(indivisible)} do not divide by {world_size} ({named})"
        return None
