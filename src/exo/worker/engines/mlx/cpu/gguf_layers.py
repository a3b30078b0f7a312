"""Linear layers and embeddings served from the GGUF a model was imported from, its blocks as the file stores them
(`--cpu-weights gguf`, issue 33): Q4_K, Q5_0, Q6_K, Q8_0, F16... whatever type each tensor has, never re-quantized.

The model is built lazily from its imported safetensors; each Linear and Embedding is then replaced, before any of
its weights is read, by a `Q8Linear` / `GgufEmbedding` whose `GgmlMatrix` is filled from the GGUF tensor's raw bytes
(read from the file one tensor at a time, not through its memory map, whose touched pages would count in the
runner's resident memory until the map is closed), so no float16 or float32 copy of a served matrix is ever
evaluated: the matrices take what the file's tensors take. Products go through the same ggml path as Q8_0's
(`q8_layers.py`). An embedding lookup dequantizes the rows it reads with gguf's own dequantizer; the table of a
model with an output head of its own, only ever looked up, is not held at all: its rows are read from the GGUF when
looked up (`FileEmbedding`, `embedding_rows.py`).

On a tensor rank (`--parallel tensor`) each sharded matrix holds this rank's slice of its GGUF tensor
(`gguf_shards.py`): a row range of the blocks for an all-to-sharded layer, a column range of the blocks for a
sharded-to-all one where the range starts and ends on the type's blocks, else the range re-quantized to Q8_0.
"""

import json
import logging
import re
from pathlib import Path
from typing import Final, cast

import gguf
import mlx.core as mx
import numpy as np
import numpy.typing as npt
from mlx import nn

from exo.models.errors import ModelLoadError
from exo.models.gguf_import import unpermute_rotary
from exo.models.gguf_source import GgufSource, GgufTensor
from exo.worker.engines.mlx.cpu.embedding_rows import FileRows
from exo.worker.engines.mlx.cpu.ggml_library import GGML_TYPES, Ggml, GgmlMatrix, PackedLayout
from exo.worker.engines.mlx.cpu.ggml_repack import RepackPolicy
from exo.worker.engines.mlx.cpu.gguf_shards import ShardKind, shard_blocks
from exo.worker.engines.mlx.cpu.matrix_replacement import replace_named_modules
from exo.worker.engines.mlx.cpu.q8_layers import (
    ALL_TO_SHARDED,
    SHARDED_TO_ALL,
    BlockDequantizer,
    Q8Embedding,
    Q8Linear,
    Q8Weights,
    fuse_swiglu_mlps,
    looked_up,
    mark_output_head,
    sharded_linear,
    share_sibling_inputs,
)

logger = logging.getLogger(__name__)

_LAYER_PATH: Final = re.compile(r"^model\.layers\.(\d+)\.")
_WRAPPED: Final = {"model.embed_tokens.embedding": "model.embed_tokens"}
"""Paths of matrices a layer-range pipeline stage wraps (`distributed/layer_split.py`: a later stage's embedding
stands behind the hidden state it receives), by the path they have unwrapped."""


class GgufEmbedding(Q8Embedding):
    """An embedding table held in its GGUF type: a lookup dequantizes the rows it reads (gguf's dequantizer, the
    numpy port of ggml's); `as_linear` (a tied output projection) is a ggml product, as Q8Embedding's."""

    def __init__(self, weights: Q8Weights, tensor_type: gguf.GGMLQuantizationType) -> None:
        super().__init__(weights)
        self.tensor_type = tensor_type
        self._dequantize = gguf_dequantizer(tensor_type)

    def __call__(self, ids: mx.array) -> mx.array:
        return looked_up(self.rows, self._dequantize, ids)


class FileEmbedding(nn.Module):
    """An embedding table only looked up (its model has an output head of its own), its rows read from the GGUF
    when a lookup needs them (`embedding_rows.FileRows`): none of it is held."""

    def __init__(self, rows: FileRows, tensor_type: gguf.GGMLQuantizationType) -> None:
        super().__init__()
        self.rows = rows
        self.tensor_type = tensor_type
        self._dequantize = gguf_dequantizer(tensor_type)

    def __call__(self, ids: mx.array) -> mx.array:
        return looked_up(self.rows, self._dequantize, ids)


def gguf_dequantizer(tensor_type: gguf.GGMLQuantizationType) -> BlockDequantizer:
    """gguf's own dequantizer (the numpy port of ggml's) of `tensor_type`'s blocks."""
    return lambda blocks: gguf.quants.dequantize(blocks, tensor_type)


def file_embedding_bytes(model: nn.Module) -> int:
    """Bytes of the embedding tables `model` reads from its file (`FileEmbedding`)."""
    return sum(module.rows.nbytes for _, module in model.named_modules() if isinstance(module, FileEmbedding))


def gguf_matrix(
    tensor: GgufTensor,
    file: Path,
    ggml: Ggml,
    rotary_heads: int | None = None,
    *,
    repack: RepackPolicy = "none",
    packed: PackedLayout | None = None,
) -> GgmlMatrix:
    """The blocks of `tensor` (of the GGUF `file`) in a ggml matrix, as stored (`rotary_heads`: a llama q/k matrix's
    heads, whose rows the GGUF interleaves and mlx-lm does not: its rows are put back, blocks untouched); packed into
    `packed`, exo's own layout, where it takes the type and shape (Q6_K: `rows_kernel.py`); under `repack`,
    interleaved for ggml's kernels where ggml has a layout for it (`ggml_repack.py`: products only, and read back
    where the layout allows). Raises ModelLoadError for a type ggml's products are not wired for here."""
    rows = gguf_rows(tensor, file, rotary_heads)
    in_features, out_features = tensor.shape
    held = (
        None
        if packed is None
        else GgmlMatrix.packed_from_blocks(ggml, tensor.type, out_features, in_features, rows, layout=packed)
    )
    if held is not None:
        return held
    repacked = (
        GgmlMatrix.repacked_from_blocks(
            ggml, tensor.type, out_features, in_features, rows, measured_only=repack == "measured"
        )
        if repack != "none"
        else None
    )
    return repacked or GgmlMatrix.from_blocks(ggml, tensor.type, out_features, in_features, rows)


def matrix_shape(tensor: GgufTensor) -> tuple[int, int]:
    """A matrix tensor's (out, in) shape as mlx-lm has it (the GGUF lists the row length first). Raises
    ModelLoadError for a type ggml's products are not wired for here, or a tensor that is no matrix."""
    if tensor.type not in GGML_TYPES or len(tensor.shape) != 2:
        raise ModelLoadError(
            f"--cpu-weights gguf cannot serve tensor {tensor.name}: {tensor.type} {list(tensor.shape)} is not a "
            f"matrix of a type exo multiplies by (served: {', '.join(GGML_TYPES)})"
        )
    in_features, out_features = tensor.shape
    return out_features, in_features


def _check_fits(source: "GgufModelSource", tensor: GgufTensor, path: str, module: nn.Module, shape: object) -> None:
    """Raises ModelLoadError where `shape` (what `tensor` holds) is not the weight shape the module at `path` has."""
    expected = tuple(module["weight"].shape)
    if shape != expected:
        raise ModelLoadError(f"{source.path}: tensor {tensor.name} is {shape}, {path} expects {expected}")


def gguf_rows(tensor: GgufTensor, file: Path, rotary_heads: int | None = None) -> npt.NDArray[np.uint8]:
    """The raw blocks of a matrix `tensor` of the GGUF `file`, one row of blocks per output row (`rotary_heads`: as
    `gguf_matrix`). Raises ModelLoadError for a type ggml's products are not wired for here."""
    out_features, _ = matrix_shape(tensor)
    raw = np.fromfile(file, dtype=np.uint8, count=tensor.nbytes, offset=tensor.offset)
    rows = raw.reshape(out_features, -1)
    return unpermute_rotary(rows, rotary_heads) if rotary_heads is not None else rows


class GgufModelSource:
    """The kept GGUF of a model directory, its tensors by the mlx-lm module path that serves each (from the
    import's record: the file's header is never parsed again); `first_layer` is the model's first layer where a
    pipeline stage numbers its kept layers from 0."""

    def __init__(self, model_dir: Path, file: Path, source: GgufSource, first_layer: int = 0) -> None:
        self.path = file
        self._tensors = source.tensors
        self._first_layer = first_layer
        config = cast(dict[str, object], json.loads((model_dir / "config.json").read_text()))
        self._architecture = config.get("model_type")
        heads, kv_heads = config.get("num_attention_heads"), config.get("num_key_value_heads")
        self._heads = heads if isinstance(heads, int) else None
        self._kv_heads = kv_heads if isinstance(kv_heads, int) else self._heads

    def tensor(self, module_path: str) -> GgufTensor | None:
        """The GGUF tensor holding the weight of the module at `module_path`, or None where the file has none."""
        module_path = _WRAPPED.get(module_path, module_path)
        if self._first_layer:
            module_path = _LAYER_PATH.sub(lambda m: f"model.layers.{int(m[1]) + self._first_layer}.", module_path)
        return self._tensors.get(f"{module_path}.weight")

    def rotary_heads(self, module_path: str) -> int | None:
        """The heads whose rows a llama GGUF interleaves in this module's matrix (None: rows as mlx-lm has them)."""
        if self._architecture != "llama":
            return None
        if module_path.endswith("self_attn.q_proj"):
            return self._heads
        if module_path.endswith("self_attn.k_proj"):
            return self._kv_heads
        return None


def _replacement(
    path: str,
    module: nn.Module,
    source: GgufModelSource,
    ggml: Ggml,
    *,
    repack: RepackPolicy,
    packed: PackedLayout | None,
    untied: bool,
) -> nn.Module | None:
    if not isinstance(module, (nn.Linear, nn.Embedding, *ALL_TO_SHARDED, *SHARDED_TO_ALL)):
        return None
    tensor = source.tensor(path)
    if tensor is None:
        logger.warning("%s has no tensor for %s: it stays as imported", source.path.name, path)
        return None
    if isinstance(module, (*ALL_TO_SHARDED, *SHARDED_TO_ALL)):
        return _sharded_replacement(path, module, tensor, source, ggml)
    if isinstance(module, nn.Embedding) and untied:
        return _file_embedding(path, module, tensor, source, ggml)
    # An embedding table's rows are read as blocks (a lookup): only a layer's product matrices are repacked or packed.
    looked_up = isinstance(module, nn.Embedding)
    matrix = gguf_matrix(
        tensor,
        source.path,
        ggml,
        source.rotary_heads(path),
        repack="none" if looked_up else repack,
        packed=None if looked_up else packed,
    )
    weights = Q8Weights(matrix)
    _check_fits(source, tensor, path, module, weights.shape)
    if isinstance(module, nn.Embedding):
        return GgufEmbedding(weights, gguf.GGMLQuantizationType[tensor.type])
    return Q8Linear(weights, module.get("bias"))


def _file_embedding(path: str, module: nn.Module, tensor: GgufTensor, source: GgufModelSource, ggml: Ggml) -> nn.Module:
    """The embedding at `path`, whose table is only looked up, read from the GGUF row by row."""
    shape = matrix_shape(tensor)
    _check_fits(source, tensor, path, module, shape)
    row_bytes = int(ggml.row_size(GGML_TYPES[tensor.type], shape[1]))
    rows = FileRows(source.path, tensor.offset, tensor.type, shape, row_bytes)
    return FileEmbedding(rows, gguf.GGMLQuantizationType[tensor.type])


def _sharded_replacement(
    path: str, module: nn.Module, tensor: GgufTensor, source: GgufModelSource, ggml: Ggml
) -> nn.Module | None:
    """A tensor rank's slice of `tensor` for the sharded layer at `path` (None: its columns do not fall on Q8_0
    blocks either, and mlx's layer keeps serving the imported slice, in float32)."""
    rows = gguf_rows(tensor, source.path, source.rotary_heads(path))
    group = cast(mx.distributed.Group, module.group)
    in_features, _ = tensor.shape
    kind: ShardKind = "columns" if isinstance(module, SHARDED_TO_ALL) else "rows"
    matrix = shard_blocks(ggml, rows, tensor.type, in_features, kind=kind, rank=group.rank(), size=group.size())
    if matrix is None:
        logger.warning("%s: this rank's columns of %s are no whole Q8_0 blocks: it stays float32", path, tensor.name)
        return None
    expected = tuple(module["weight"].shape)
    if matrix.shape != expected:
        raise ModelLoadError(
            f"{source.path}: this rank's slice of {tensor.name} is {matrix.shape}, {path} expects {expected}"
        )
    return sharded_linear(module, Q8Weights(matrix))


def load_gguf_matrices(
    model: nn.Module,
    source: GgufModelSource,
    ggml: Ggml,
    *,
    repack: RepackPolicy = "none",
    packed: PackedLayout | None = None,
) -> int:
    """Replace every Linear and Embedding of `model` (built lazily, its weights never read) by its GGUF tensor's
    blocks, one at a time, and a tensor rank's sharded layers by this rank's slice of them; returns how many. Others
    stay as they are (the caller sets their dtype; `repack`: which of a layer's matrices of a type ggml repacks for
    this CPU are held interleaved; `packed`: exo's own layout a layer's matrices of the types it takes are packed
    into). Sibling layers (q/k/v, gate/up) then share one ggml graph, as under q8_0 (their types may differ: one graph
    holds them all)."""
    # An untied model's embedding is only looked up (its output head is `lm_head`): read from the file, not held.
    untied = model.get("lm_head") is not None
    replaced = replace_named_modules(
        model,
        lambda path, module: _replacement(path, module, source, ggml, repack=repack, packed=packed, untied=untied),
    )
    share_sibling_inputs(model)
    fuse_swiglu_mlps(model)
    mark_output_head(model)
    return replaced


def packed_matrices(model: nn.Module) -> int:
    """How many of `model`'s matrices are packed into exo's own layout (`gguf_matrix`'s `packed`)."""
    return sum(
        module.q8.matrix.packed_by is not None for _, module in model.named_modules() if isinstance(module, Q8Linear)
    )
