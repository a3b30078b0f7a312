"""A KV cache counting outside uses of its buffers (`owned_kv_cache.py`): the CPU decode graph writes a step's keys
and values into the buffers in place only while nothing but the cache can hold them. Every way another holder can
appear (a read or write of `keys`/`values`, a copy, a deep copy) marks them shared; a step appended through mlx into
new arrays, once evaluated, makes them the cache's own again; the cache saves and loads as mlx-lm's KVCache."""

import copy
from pathlib import Path
from typing import cast

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import KVCache, load_prompt_cache, save_prompt_cache

from exo.worker.engines.mlx.cache.owned_kv_cache import (
    OwnedKVCache,
    adopt,
    append_through_mlx,
    buffers_of,
    is_plain_kv_cache,
    settle,
    state,
)


def _filled(positions: int = 5) -> KVCache:
    cache = KVCache()
    keys = mx.arange(positions * 2 * 4, dtype=mx.float32).reshape(1, 2, positions, 4)
    cache.update_and_fetch(keys, keys + 1000)
    mx.eval(cache.keys, cache.values)
    return cache


def _owned(positions: int = 5) -> OwnedKVCache:
    """A cache whose buffers a settled step made its own."""
    cache = adopt(_filled(positions))
    step = mx.full((1, 2, 1, 4), -1.0)
    append_through_mlx(cache, step, step)
    mx.eval(*[array for array in buffers_of(cache) if array is not None])
    settle(cache)
    assert state(cache) == "owned"
    return cache


def test_adopting_keeps_the_cache_and_its_contents_and_starts_shared() -> None:
    cache = _filled()
    keys, values = np.array(cache.keys), np.array(cache.values)
    adopted = adopt(cache)
    assert adopted is cache
    assert isinstance(adopted, KVCache)
    assert is_plain_kv_cache(adopted)
    assert state(adopted) == "shared"
    assert "keys" not in adopted.__dict__  # no second reference left behind in the instance's attributes
    np.testing.assert_array_equal(np.array(adopted.keys), keys)
    np.testing.assert_array_equal(np.array(adopted.values), values)
    assert adopt(adopted) is adopted


def test_a_step_through_mlx_is_pending_until_evaluated_then_owned() -> None:
    cache = adopt(_filled())
    step = mx.full((1, 2, 1, 4), 7.0)
    append_through_mlx(cache, step, step * 2)
    assert state(cache) == "pending"
    assert cache.offset == 6
    keys, values = buffers_of(cache)
    assert keys is not None
    assert values is not None
    mx.eval(keys, values)
    settle(cache)
    assert state(cache) == "owned"
    np.testing.assert_array_equal(np.array(keys[..., 5, :]), np.full((1, 2, 4), 7.0))
    np.testing.assert_array_equal(np.array(values[..., 5, :]), np.full((1, 2, 4), 14.0))
    np.testing.assert_array_equal(np.array(keys[..., :5, :]), np.array(_filled().keys)[..., :5, :])


@pytest.mark.parametrize(
    "outside_use",
    [
        lambda cache: cache.keys,
        lambda cache: cache.values,
        lambda cache: cache.state,
        lambda cache: cache.update_and_fetch(mx.zeros((1, 2, 1, 4)), mx.zeros((1, 2, 1, 4))),
        lambda cache: setattr(cache, "keys", cache.__dict__["_exo_keys"]),
        copy.copy,
        copy.deepcopy,
    ],
    ids=["keys", "values", "state", "update_and_fetch", "keys assigned", "copy", "deepcopy"],
)
def test_every_outside_use_marks_the_buffers_shared(outside_use: object) -> None:
    cache = _owned()
    assert callable(outside_use)
    outside_use(cache)
    assert state(cache) == "shared"


def test_copies_are_shared_and_trimming_or_reading_the_offset_is_not_an_outside_use() -> None:
    cache = _owned()
    for copied in (copy.copy(cache), copy.deepcopy(cache)):
        assert type(copied) is OwnedKVCache
        assert state(copied) == "shared"
        np.testing.assert_array_equal(np.array(buffers_of(copied)[0]), np.array(buffers_of(cache)[0]))
    cache = _owned()
    assert cache.trim(2) == 2
    assert cache.offset == 4
    assert cache.is_trimmable()
    assert state(cache) == "owned"


def test_settling_leaves_shared_buffers_shared() -> None:
    cache = _owned()
    _ = cache.keys
    settle(cache)
    assert state(cache) == "shared"


def test_a_step_without_room_is_refused() -> None:
    cache = adopt(_filled(KVCache.step))
    step = mx.zeros((1, 2, 1, 4))
    with pytest.raises(ValueError, match="no room"):
        append_through_mlx(cache, step, step)


def test_only_mlx_lms_own_kv_cache_is_adopted() -> None:
    class Chunked(KVCache):
        pass

    with pytest.raises(TypeError, match="only mlx-lm's KVCache"):
        adopt(Chunked())
    assert not is_plain_kv_cache(Chunked())


def test_an_owned_cache_saves_and_loads_as_mlx_lms_kv_cache(tmp_path: Path) -> None:
    cache = _owned()
    keys = np.array(buffers_of(cache)[0])[..., : cache.offset, :]
    path = tmp_path / "cache.safetensors"
    save_prompt_cache(str(path), [cache])
    loaded_caches = load_prompt_cache(str(path))
    assert isinstance(loaded_caches, list)
    (loaded,) = cast(list[KVCache], loaded_caches)
    assert type(loaded) is KVCache
    assert loaded.offset == cache.offset
    np.testing.assert_array_equal(np.array(loaded.keys)[..., : loaded.offset, :], keys)
