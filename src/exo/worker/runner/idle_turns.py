"""Memory a runner hands back to the system when its last task ends.

A prompt's prefill and a task's end leave freed buffers behind: mlx keeps freed arrays in its buffer cache and glibc
keeps freed memory in its heap, so without this the runner stays at its peak until a later request reuses them.
When the runner goes idle it empties mlx's cache and trims the heap, once per busy spell (3-8 ms on the default
model after a prefill, the loaded objects frozen out of the collector's pass: `freeze_long_lived`); the next request
allocates again (page faults: milliseconds, against its prefill's seconds). With the tokenizer's copies dropped
(`tokenizer_memory.py`), a 5,508-token prompt left the default model's runner at 968 MB, 1,133 MB before.
"""

from collections.abc import Callable

import mlx.core as mx

from exo.shared.freed_memory import collect_and_trim


def release_freed_memory() -> None:
    """Empty mlx's buffer cache, then free reference cycles and trim the heap."""
    mx.clear_cache()
    collect_and_trim()


class IdleMemory:
    """Releases freed memory (`release`) the first time the runner is idle after being busy; a runner that has just
    loaded counts as busy (the load leaves its own freed buffers)."""

    def __init__(self, release: Callable[[], None] = release_freed_memory) -> None:
        self._release = release
        self._held = True

    def busy(self) -> None:
        """A step ran: its buffers may be freed when the runner next goes idle."""
        self._held = True

    def idle(self) -> None:
        """The runner has nothing to run: release what the busy spell freed (nothing the second time)."""
        if self._held:
            self._release()
            self._held = False
