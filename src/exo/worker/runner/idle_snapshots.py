"""Disk snapshots of the prefix cache are written while the runner has nothing else to do, and before it stops."""

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from exo.worker.engines.mlx.cache.prefix_cache import PrefixCache

logger = logging.getLogger(__name__)

SHUTDOWN_SNAPSHOT_SECONDS: Final = 10.0
"""How long a stopping runner may go on writing queued snapshots (the supervisor waits a little longer for it):
a long prompt's snapshot takes seconds on a loaded machine, and without it the restarted node prefills it all."""


def write_snapshots_while_idle(prefix_cache: "PrefixCache", message_waiting: Callable[[], bool]) -> None:
    """Write the queued snapshots one at a time until a message waits (a request then waits one write at most)."""
    while prefix_cache.snapshots_pending and not message_waiting():
        prefix_cache.write_pending_snapshot()


def write_snapshots_before_stopping(
    prefix_cache: "PrefixCache", budget_seconds: float = SHUTDOWN_SNAPSHOT_SECONDS
) -> None:
    """Write the queued snapshots, the latest session's first (always), then the others while `budget_seconds`
    last (a write under way when the time runs out is finished); say in the log what was left unwritten."""
    deadline = time.monotonic() + budget_seconds
    written = 0
    while prefix_cache.snapshots_pending and (written == 0 or time.monotonic() < deadline):
        prefix_cache.write_pending_snapshot(newest=True)
        written += 1
    if prefix_cache.snapshots_pending:
        logger.warning(
            "prefix cache: stopping with disk snapshots unwritten after %.0f s (%d written)", budget_seconds, written
        )
    elif written:
        logger.info("prefix cache: wrote %d disk snapshots before stopping", written)
