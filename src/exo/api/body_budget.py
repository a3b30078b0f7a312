"""How much of large request bodies the API holds at once, and giving their memory back once they are done.

Parsing a JSON body costs several times its size (the bytes, the decoded text, the parsed values, the validated
request, the command sent on), so a handful of clients each sending a body near the size limit at the same moment
could take the node's memory many times over. A body over LARGE_BODY_BYTES therefore takes its size from a budget
of `max_body_bytes` before it is read, and gives it back once its answer starts (the request is parsed and
submitted by then) or the request ends: beyond the budget, large requests wait their turn while small ones never
wait. When the last large request has given its bytes back, the allocator is asked to return freed memory to the
system (glibc keeps it otherwise, and the process would stay at its peak).
"""

import logging
from typing import Final

import anyio

from exo.shared.freed_memory import collect_and_trim

logger = logging.getLogger(__name__)

LARGE_BODY_BYTES: Final = 1024 * 1024
"""Bodies above this share the budget; below it (every ordinary request, agent contexts included) they never wait."""


class BodyBudget:
    """Bytes of large bodies in flight, at most `limit` at a time."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._used = 0
        self._changed = anyio.Condition()

    @property
    def used(self) -> int:
        return self._used

    async def take(self, size: int) -> int:
        """Wait until `size` bytes fit (at most the limit) and take them; returns what was taken."""
        size = min(size, self._limit)
        async with self._changed:
            while self._used + size > self._limit:
                await self._changed.wait()
            self._used += size
        return size

    async def give_back(self, size: int) -> None:
        """Return `size` bytes, letting waiting bodies in."""
        async with self._changed:
            self._used -= size
            self._changed.notify_all()

    async def settle(self) -> None:
        """Once no large body is in flight, free what the large requests left in reference cycles and hand the
        memory back to the system (called as a large request ends, when what it sent on is done with too)."""
        if self._used == 0:
            await anyio.to_thread.run_sync(collect_and_trim)
