"""A one-sequence KV cache whose buffers the CPU decode graph writes its new keys and values into in place.

mlx arrays are values. mlx-lm's KVCache appends a step's keys with a slice assignment, which mlx performs in place
only where no other array holds the buffer, and as a copy of the whole buffer where one does: a leased prefix-cache
entry sharing its stored entry's buffers, a snapshot's view. Writing a step's keys and values from ggml's graph
straight into the buffers, as llama.cpp writes its cache, saves mlx's appends (one evaluated operation per layer and
per tensor, about 0.7 ms of the default model's 22 ms step). It is right only where nothing else holds the buffers, and
mlx cannot be asked that from Python.

So this cache keeps count. Its `keys` and `values` are properties: any read or write through them (mlx-lm's own
passes, a snapshot, the prefix cache, a copy) marks the buffers "shared". The decode graph reads them without
marking (`buffers_of`); a step it computes while they are shared is appended through mlx into new arrays
(`append_through_mlx`: mlx copies a buffer anything else holds), which marks them "pending"; once that step is
evaluated (`settle`) the arrays are this cache's alone, "owned", and the graph writes into them until the next
outside use.
"""

import copy
from typing import Final, Literal, TypeGuard, cast

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache

BufferState = Literal["shared", "pending", "owned"]

_KEYS: Final = "_exo_keys"
_VALUES: Final = "_exo_values"
_STATE: Final = "_exo_state"


def _counted(slot: str) -> property:
    """A cache's `keys` or `values`, held in `slot`: reading or assigning it is an outside use of the buffers."""

    def read(cache: KVCache) -> mx.array | None:
        cache.__dict__[_STATE] = "shared"
        return cache.__dict__.get(slot)

    def assign(cache: KVCache, array: mx.array | None) -> None:
        cache.__dict__[_STATE] = "shared"
        cache.__dict__[slot] = array

    return property(read, assign)


class OwnedKVCache(KVCache):
    """mlx-lm's KVCache, counting outside uses of its buffers (module docstring). Made by `adopt`."""

    keys = _counted(_KEYS)  # pyright: ignore[reportIncompatibleVariableOverride, reportAssignmentType]
    values = _counted(_VALUES)  # pyright: ignore[reportIncompatibleVariableOverride, reportAssignmentType]

    def __copy__(self) -> "OwnedKVCache":
        self.__dict__[_STATE] = "shared"
        copied = OwnedKVCache.__new__(OwnedKVCache)
        copied.__dict__.update(self.__dict__)
        return copied

    def __deepcopy__(self, memo: dict[int, object]) -> "OwnedKVCache":
        self.__dict__[_STATE] = "shared"
        copied = OwnedKVCache.__new__(OwnedKVCache)
        memo[id(self)] = copied
        copied.__dict__.update({name: copy.deepcopy(value, memo) for name, value in self.__dict__.items()})
        return copied


# mlx-lm's cache files name each layer's class and load it by that name from its own module; this class's state is
# KVCache's, so it is saved (and the disk tier checks it) as one.
OwnedKVCache.__name__ = OwnedKVCache.__qualname__ = KVCache.__name__

PLAIN_KV_CACHES: Final = (KVCache, OwnedKVCache)
"""mlx-lm's plain one-sequence cache, counted or not (not its subclasses with other layouts, as ChunkedKVCache)."""


def is_plain_kv_cache(layer: object) -> TypeGuard[KVCache]:
    return type(layer) in PLAIN_KV_CACHES


def adopt(cache: KVCache) -> OwnedKVCache:
    """`cache` itself, counting outside uses of its buffers from now on: shared until a step settles them."""
    if isinstance(cache, OwnedKVCache):
        return cache
    if type(cache) is not KVCache:
        raise TypeError(f"only mlx-lm's KVCache is adopted, not {type(cache).__name__}")
    attributes = cache.__dict__
    keys, values = attributes.pop("keys", None), attributes.pop("values", None)
    cache.__class__ = OwnedKVCache
    attributes[_KEYS], attributes[_VALUES], attributes[_STATE] = keys, values, "shared"
    return cast(OwnedKVCache, cache)


def buffers_of(cache: KVCache | BatchKVCache) -> tuple[mx.array | None, mx.array | None]:
    """The cache's keys and values, read by the decode graph (not an outside use; any other cache's as it holds
    them)."""
    if type(cache) is OwnedKVCache:
        return cache.__dict__.get(_KEYS), cache.__dict__.get(_VALUES)
    return cache.keys, cache.values


def has_room(cache: KVCache, rows: int) -> bool:
    """Whether the cache's buffers hold `rows` more positions after those it holds (else mlx-lm grows them)."""
    keys, values = buffers_of(cache)
    return keys is not None and values is not None and cache.offset + rows <= keys.shape[2]


def state(cache: KVCache) -> BufferState:
    return cache.__dict__.get(_STATE, "shared") if type(cache) is OwnedKVCache else "shared"


def append_through_mlx(cache: OwnedKVCache, keys: mx.array, values: mx.array) -> None:
    """Append a step's keys and values where the buffers have room, into new arrays (mlx copies a buffer another
    array holds, else it writes in place): pending until evaluated. Raises ValueError where there is no room."""
    held_keys, held_values = buffers_of(cache)
    start, rows = cache.offset, keys.shape[2]
    if held_keys is None or held_values is None or not has_room(cache, rows):
        raise ValueError("the cache's buffers have no room for the step")
    at = mx.array([start])
    cache.__dict__[_KEYS] = mx.slice_update(held_keys, keys, at, [2])
    cache.__dict__[_VALUES] = mx.slice_update(held_values, values, at, [2])
    cache.__dict__[_STATE] = "pending"
    cache.offset = start + rows


def settle(cache: object) -> None:
    """After the cache's arrays were evaluated: a pending append leaves them this cache's alone."""
    if type(cache) is OwnedKVCache and cache.__dict__.get(_STATE) == "pending":
        cache.__dict__[_STATE] = "owned"
