"""Cutting a loaded (still lazy) model down to one pipeline rank's layers, with rank 0 running the last ones.

Two strategies. A model family with mlx-lm's own `PipelineMixin` (Qwen2, Qwen3-MoE, DeepSeek V3…) is split by its
`pipeline(group, split)`: each rank receives the hidden state from the rank after it, runs its layers, sends to the
rank before it, and an all-gather hands rank 0's final hidden state to every rank. Other families whose inner model
is plainly "embed → layers → norm" get the same split from a layer-range wrapper: the embedding of a rank that does
not run the first layers is replaced by a receive from the previous stage, the final norm of a rank other than 0 by
a send to the next stage (rank 0 alone needs the final hidden state, so there is no all-gather).

Layers cut away are dropped before anything is evaluated: their weights are never read from disk.
"""

from collections.abc import Callable
from typing import Final, cast

import mlx.core as mx
from mlx import nn

from exo.shared.types.worker.shards import PipelineStrategy, ShardAssignment
from exo.worker.engines.mlx.cache.layer_cache import PromptCache

# Inner models whose forward pass is exactly `h = embed_tokens(x)`, a mask from `cache[0]`, `zip(layers, cache)`,
# `norm(h)` (read from mlx-lm 0.32's sources); llama's mask-layer indices are renumbered below.
LAYER_RANGE_MODEL_TYPES: Final = frozenset({"llama", "mistral", "qwen3", "phi3", "olmo2", "starcoder2"})


def _member(module: object, name: str) -> Callable[..., mx.array]:
    """A callable member of an mlx-lm module (mlx_lm ships no types)."""
    return cast(Callable[..., mx.array], getattr(module, name))


class UnsplittableModelError(ValueError):
    """The model cannot be split into pipeline stages; the message says why."""


class _ReceivedHidden(nn.Module):
    """Stands in for the embedding on a rank that does not run the first layers: the hidden state arrives from the
    rank running the layers before this one. Keeps the embedding for a tied output head (`as_linear`)."""

    def __init__(self, embedding: nn.Module, source_rank: int, group: mx.distributed.Group) -> None:
        super().__init__()
        self.embedding = embedding
        self._source_rank = source_rank
        self._group = group

    def __call__(self, inputs: mx.array) -> mx.array:
        # recv_like only takes the shape and dtype of the (never computed) embedding lookup.
        shaped_like = _member(self, "embedding")(inputs)
        return mx.distributed.recv_like(shaped_like, self._source_rank, group=self._group)

    def as_linear(self, hidden: mx.array) -> mx.array:
        return _member(self.embedding, "as_linear")(hidden)  # Embedding and QuantizedEmbedding both have it


class _SentHidden(nn.Module):
    """Stands in for the final norm on a rank other than 0: the hidden state goes on to the next stage."""

    def __init__(self, norm: nn.Module, destination_rank: int, group: mx.distributed.Group) -> None:
        super().__init__()
        self.norm = norm
        self._destination_rank = destination_rank
        self._group = group

    def __call__(self, hidden: mx.array) -> mx.array:
        return mx.distributed.send(hidden, self._destination_rank, group=self._group)


def split_layers(model: nn.Module, group: mx.distributed.Group, shard: ShardAssignment) -> PipelineStrategy:
    """Keep only `shard`'s layers of `model` (loaded lazily) and wire it to its neighbours in `group`."""
    peers = shard.peers
    if peers is None:
        raise ValueError("only a pipeline shard is split")
    inner = getattr(model, "model", None)
    layers: object = getattr(inner, "layers", None)
    if not isinstance(inner, nn.Module) or not isinstance(layers, list):
        raise UnsplittableModelError("the model has no `model.layers` list to split")
    if len(cast(list[nn.Module], layers)) != peers.num_layers:
        raise UnsplittableModelError(
            f"the placement splits {peers.num_layers} layers but the model has {len(cast(list[nn.Module], layers))}"
        )
    if hasattr(inner, "pipeline"):
        _member(inner, "pipeline")(group, split=list(peers.layer_counts))
        return "mlx-lm"
    model_type = getattr(model, "model_type", None)
    if model_type not in LAYER_RANGE_MODEL_TYPES:
        raise UnsplittableModelError(
            f"model type {model_type!r} has no pipeline support in mlx-lm and its layers are not known to split "
            f"cleanly (split here: mlx-lm's pipeline families and {', '.join(sorted(LAYER_RANGE_MODEL_TYPES))})"
        )
    _split_layer_range(inner, cast(list[nn.Module], layers), group, shard)
    return "layer-range"


def _split_layer_range(
    inner: nn.Module, layers: list[nn.Module], group: mx.distributed.Group, shard: ShardAssignment
) -> None:
    start, end = shard.start_layer, shard.end_layer
    assert end is not None
    local = layers[start:end]
    inner.layers = local
    if shard.rank < shard.world_size - 1:
        inner.embed_tokens = _ReceivedHidden(cast(nn.Module, inner.embed_tokens), shard.rank + 1, group)  # pyright: ignore[reportAttributeAccessIssue]
    if shard.rank > 0:
        inner.norm = _SentHidden(cast(nn.Module, inner.norm), shard.rank - 1, group)  # pyright: ignore[reportAttributeAccessIssue]
    if hasattr(inner, "fa_idx"):
        # llama computes its full- and sliding-attention masks from the caches at these indices of its layer list.
        sliding = [bool(getattr(layer, "use_sliding", False)) for layer in local]
        inner.fa_idx = sliding.index(False) if False in sliding else 0
        inner.swa_idx = sliding.index(True) if True in sliding else None


def stage_forward(model: nn.Module, tokens: mx.array, cache: PromptCache, *, leader: bool) -> mx.array:
    """One forward pass of this rank's stage over `tokens` (shape (1, L)).

    Rank 0 gets the logits. Every other rank gets its stage's output: evaluating it runs the rank's layers and sends
    the hidden state on (and, for mlx-lm's pipelines, takes part in the final all-gather), without the output head.
    """
    if leader:
        return _member(model, "__call__")(tokens, cache=cache)
    return _member(model.model, "__call__")(tokens, cache=cache)
