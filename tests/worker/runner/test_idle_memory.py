"""A runner hands freed memory back once each time it goes idle after work."""

import mlx.core as mx

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
