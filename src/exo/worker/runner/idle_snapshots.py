"""Disk snapshots of the prefix cache are written while the runner has nothing else to do."""

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from exo.worker.engines.mlx.cache.prefix_cache import PrefixCache


def write_snapshots_while_idle(prefix_cache: "PrefixCache", message_waiting: Callable[[], bool]) -> None:
    """Write the queued snapshots one at a time until a message waits (a request then waits one write at most)."""
    while prefix_cache.snapshots_pending and not message_waiting():
        prefix_cache.write_pending_snapshot()
