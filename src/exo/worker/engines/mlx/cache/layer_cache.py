"""Typed wrappers around mlx-lm's per-layer KV caches.

mlx_lm.models.cache is untyped (its functions take and return ``List[Any]``); everything in this package goes
through these few functions so the rest of the code sees a small, typed surface.
"""

from typing import Protocol, TypeAlias

import mlx.core as mx
from mlx import nn
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

from exo.worker.engines.mlx.cache.owned_kv_cache import is_plain_kv_cache


class LayerCache(Protocol):
    """What this package relies on from an mlx-lm layer cache (KVCache, RotatingKVCache, QuantizedKVCache...)."""

    @property
    def nbytes(self) -> int: ...

    def is_trimmable(self) -> bool: ...

    def trim(self, n: int) -> int: ...


PromptCache: TypeAlias = list[LayerCache]
"""One cache per model layer, in layer order: what mlx-lm's ``prompt_cache=`` arguments take."""


def new_prompt_cache(model: nn.Module) -> PromptCache:
    """An empty cache for ``model`` (the model's own ``make_cache`` when it has one, plain KVCaches otherwise)."""
    return list(make_prompt_cache(model))


def can_batch(model: nn.Module) -> bool:
    """Whether mlx-lm can decode several sequences of ``model`` in one batch (every layer's cache can merge)."""
    return all(hasattr(layer, "merge") for layer in make_prompt_cache(model))


def can_trim(cache: PromptCache) -> bool:
    """Whether every layer can drop its most recent tokens (rotating caches that wrapped, SSM states cannot)."""
    return bool(can_trim_prompt_cache(cache))


def trim_tokens(cache: PromptCache, num_tokens: int) -> int:
    """Drop the last ``num_tokens`` tokens from every layer in place; returns how many were dropped.

    Returns 0 when the cache cannot be trimmed.
    """
    # mlx-lm annotates the return as a list, but it returns the first layer's trimmed count.
    trimmed: object = trim_prompt_cache(cache, num_tokens)
    return trimmed if isinstance(trimmed, int) else 0


def held_token_count(cache: PromptCache) -> int | None:
    """How many tokens the cache holds, or None when that cannot be verified.

    Layers report it as an integer ``offset``. Layers without one (e.g. recurrent states) are skipped; if no layer
    has one, or layers disagree, the count is unknown and the cache must not be trusted for reuse.
    """
    offsets = {offset for offset in (getattr(layer, "offset", None) for layer in cache) if isinstance(offset, int)}
    if len(offsets) != 1:
        return None
    return offsets.pop()


def materialize(cache: PromptCache) -> None:
    """Evaluate the cache's pending computation so a stored cache holds plain buffers, not a graph of the last step."""
    mx.eval([getattr(layer, "state", None) for layer in cache])


def compact(cache: PromptCache) -> None:
    """Cut plain KV layers' buffers to the tokens they hold, in place.

    mlx-lm grows a KVCache in steps and trimming only moves its offset, so a cache trimmed from a long one keeps the
    long one's buffers: stored as is, a 370-token prompt's cache took (in memory and on disk) what a 5,600-token one
    does. The copy is evaluated later with the rest of the cache (`materialize`).
    """
    for layer in cache:
        if not is_plain_kv_cache(layer):
            continue
        keys: mx.array | None = layer.keys
        values: mx.array | None = layer.values
        offset: int = layer.offset
        if keys is None or values is None or keys.shape[2] <= offset:
            continue
        layer.keys = mx.contiguous(keys[..., :offset, :])
        layer.values = mx.contiguous(values[..., :offset, :])
