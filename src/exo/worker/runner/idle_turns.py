"""What a serving loop does as it turns idle and as it turns back to work, once per turn.

Turning idle, it hands freed memory back to the system. A prompt's prefill and a task's end leave freed buffers
behind: mlx keeps freed arrays in its buffer cache and glibc keeps freed memory in its heap, so without this the
runner stays at its peak until a later request reuses them. It frees what the decode graph keeps between passes
(the ggml buffer a prefill's layer passes grew, 32.5 MiB for the default model's 512-token pieces, and the step
graphs kept for the next steps, 22 MiB after the load's pass-cost probe), empties mlx's cache and trims the heap
(3-8 ms on the default model after a prefill, the loaded objects frozen out of the collector's pass:
`freeze_long_lived`); the next request allocates again (page faults: milliseconds, against its prefill's seconds).
After a new 5,531-token prompt the default model's runner holds 811-812 MB, 1.29x its GGUF plus the prompt's KV
(docs/PERFORMANCE.md section 12).

Turning back to work, it starts a new window of ggml's thread count (`start_ggml_window`): what other processes did
while the runner waited says nothing of the cores during its work.
"""

import gc
from collections.abc import Callable

import mlx.core as mx

from exo.shared.freed_memory import trim_heap
from exo.worker.engines.mlx.cpu.core_share import start_ggml_window
from exo.worker.engines.mlx.cpu.decode_graph import release_idle_buffers


def release_freed_memory() -> None:
    """Free reference cycles and what the decode graphs keep between passes, empty mlx's cache, then trim the heap."""
    # The collector first: arrays it frees (an exception's frames hold them in a cycle) go to mlx's cache.
    gc.collect()
    release_idle_buffers()
    mx.clear_cache()
    trim_heap()


class IdleTurns:
    """Calls `release` the first time the loop is idle after work and `resume` the first time it works after being
    idle; a runner that has just loaded counts as working (the load leaves its own freed buffers)."""

    def __init__(
        self, release: Callable[[], None] = release_freed_memory, resume: Callable[[], None] = start_ggml_window
    ) -> None:
        self._release = release
        self._resume = resume
        self._working = True

    def working(self) -> None:
        """The loop is about to run a step: back from idle, `resume` (nothing if it was working already)."""
        if not self._working:
            self._resume()
            self._working = True

    def idle(self) -> None:
        """The loop has nothing to run: release what the work freed (nothing if it was idle already)."""
        if self._working:
            self._release()
            self._working = False
