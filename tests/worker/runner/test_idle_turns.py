"""A runner hands freed memory back once each time it goes idle after work."""

import gc
import weakref

import mlx.core as mx

from exo.shared.freed_memory import freeze_long_lived
from exo.worker.runner.idle_memory import IdleMemory, release_freed_memory


def test_memory_is_released_once_per_busy_spell_and_once_after_loading() -> None:
    released: list[int] = []
    memory = IdleMemory(lambda: released.append(1))
    memory.idle()  # just loaded: the load's freed buffers go
    memory.idle()
    assert len(released) == 1
    memory.busy()
    memory.busy()
    assert len(released) == 1
    memory.idle()
    memory.idle()
    assert len(released) == 2


def test_releasing_empties_mlxs_buffer_cache() -> None:
    mx.clear_cache()
    held = mx.zeros((1024, 1024)) + 1
    mx.eval(held)
    del held
    assert mx.get_cache_memory() >= 4 * 1024 * 1024
    release_freed_memory()
    assert mx.get_cache_memory() == 0


def test_freezing_collects_garbage_first_and_exempts_what_is_left() -> None:
    class Node:
        def __init__(self) -> None:
            self.other: Node | None = None

    kept, garbage = Node(), Node()
    garbage.other = Node()
    garbage.other.other = garbage  # a cycle only the collector frees
    gone = weakref.ref(garbage)
    del garbage
    frozen_before = gc.get_freeze_count()
    try:
        freeze_long_lived()
        assert gone() is None  # collected, not frozen for the runner's life
        assert gc.get_freeze_count() > frozen_before
        assert not any(candidate is kept for candidate in gc.get_objects())  # out of the collector's generations
    finally:
        gc.unfreeze()
    assert any(candidate is kept for candidate in gc.get_objects())
