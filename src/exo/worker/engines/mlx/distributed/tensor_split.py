"""Cutting a loaded (still lazy) model down to one tensor-parallel rank's share, by mlx-lm's own `shard(group)`.

mlx-lm's models (Llama, Qwen2, Qwen3 and others) replace each layer's query/key/value and MLP gate/up projections
by all-to-sharded linears (this rank's rows: its attention heads, KV heads and MLP columns) and the output and down
projections by sharded-to-all ones (this rank's columns, then an all-sum over the group), and divide the layer's head
counts by the group's size. Every rank then runs every layer; each forward pass sums the partial products over the
ring, twice a layer, so the ranks must run the same passes in the same order (the pipeline's lockstep does that).
The embeddings, final norm and output head are not split: every rank holds them and gets the whole logits.

Sharding before anything is evaluated means each rank materializes only its slices of the split matrices.
"""

from collections.abc import Callable
from typing import cast

import mlx.core as mx
from mlx import nn

from exo.shared.types.worker.shards import PipelineStrategy
from exo.worker.engines.mlx.distributed.layer_split import UnsplittableModelError


def shard_matrices(model: nn.Module, group: mx.distributed.Group) -> PipelineStrategy:
    """Keep this rank's share of `model`'s layers (mlx-lm's `shard`); raises UnsplittableModelError for a family
    mlx-lm cannot split so."""
    shard = getattr(model, "shard", None)
    if not callable(shard):
        model_type = getattr(model, "model_type", None)
        raise UnsplittableModelError(f"model type {model_type!r} has no tensor-parallel support in mlx-lm (`shard`)")
    cast(Callable[[mx.distributed.Group], None], shard)(group)
    return "tensor"
