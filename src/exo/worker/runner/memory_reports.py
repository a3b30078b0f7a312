"""A runner's own account of its memory (mlx's arrays and cache, the prefix cache's tiers) for its supervisor: with
each task's end, so steady load that never lets the runner idle still shows, and, when it changed, after the runner
turns idle (freed buffers released, queued snapshots written) and as tasks leave a split model's other ranks (at most
once a second there: each report is a node event, and rank 0's task ends already carry its own)."""

import time
from typing import TYPE_CHECKING, Final

from exo.shared.types.worker.runner_response import RunnerMemory, RunnerMemoryReport
from exo.worker.runner.channel import RunnerChannel

if TYPE_CHECKING:
    from exo.worker.engines.mlx.cache.prefix_cache import PrefixCache


def runner_memory(prefix_cache: "PrefixCache | None") -> RunnerMemory:
    import mlx.core as mx  # here, as the runner's other mlx imports: the module loads before mlx is checked for

    return RunnerMemory(
        mlx_active_bytes=mx.get_active_memory(),
        mlx_cache_bytes=mx.get_cache_memory(),
        prefix_cache=prefix_cache.usage() if prefix_cache is not None else None,
    )


# A busy follower rank reports its memory as tasks leave it at most this often; it reports again once idle.
LEAVE_REPORT_SECONDS: Final = 1.0


class MemoryReports:
    """`runner_memory` for a task's end, and sent on `channel` when it differs from what went out last."""

    def __init__(self, channel: RunnerChannel, prefix_cache: "PrefixCache | None") -> None:
        self._channel = channel
        self._prefix_cache = prefix_cache
        self._sent: RunnerMemory | None = None
        self._sent_at = float("-inf")

    def at_task_end(self) -> RunnerMemory:
        """The memory now, for the step's task ends to carry (counted as sent)."""
        self._sent = runner_memory(self._prefix_cache)
        return self._sent

    def report(self, *, at_most_every: float = 0.0) -> None:
        """Send the memory now if it changed, and if `at_most_every` seconds have passed since the last send."""
        now = time.monotonic()
        if now - self._sent_at < at_most_every:
            return
        memory = runner_memory(self._prefix_cache)
        if memory != self._sent:
            self._channel.send(RunnerMemoryReport(memory=memory))
            self._sent, self._sent_at = memory, now
