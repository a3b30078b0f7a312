"""A serving loop hands freed memory back once each time it goes idle after work, and starts a new window of ggml's
thread count once each time it goes back to work."""

import gc
import weakref

import mlx.core as mx

from exo.shared.freed_memory import freeze_long_lived
from exo.worker.runner.idle_turns import IdleTurns, release_freed_memory


def test_memory_is_released_once_per_busy_spell_and_once_after_loading() -> None:
    released: list[int] = []
    turns = IdleTurns(lambda: released.append(1), lambda: None)
    turns.idle()  # just loaded: the load's freed buffers go
    turns.idle()
    assert len(released) == 1
    turns.working()
    turns.working()
    assert len(released) == 1
    turns.idle()
    turns.idle()
    assert len(released) == 2


def test_work_after_idle_resumes_once_a_turn_and_not_right_after_loading() -> None:
    resumed: list[int] = []
    turns = IdleTurns(lambda: None, lambda: resumed.append(1))
    turns.working()  # just loaded: no idle wait to leave behind
    assert resumed == []
    turns.idle()
    turns.working()
    turns.working()
    assert len(resumed) == 1
    turns.idle()
    turns.idle()
    turns.working()
    assert len(resumed) == 2


def test_releasing_empties_mlxs_buffer_cache() -> None:
    mx.clear_cache()
    held = mx.zeros((1024, 1024)) + 1
    mx.eval(held)
    del held
    assert mx.get_cache_memory() >= 4 * 1024 * 1024
    release_freed_memory()
    assert mx.get_cache_memory() == 0


def test_releasing_also_empties_what_the_collector_frees_into_mlxs_cache() -> None:
    class Holder:
        def __init__(self) -> None:
            self.array = mx.zeros((1024, 1024)) + 1
            self.me = self  # a cycle: only the collector frees the array

    mx.clear_cache()
    holder = Holder()
    mx.eval(holder.array)
    del holder
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
