"""How long a pipeline rank waits for the others to join its ring, and how its runner ends when they have not.

mlx's ring backend holds the GIL while it connects and accepts (measured: a rank 0 alone waited in `accept` with no
other Python thread running, a rank 1 alone for 31 s before "Couldn't connect"), so no Python timer can end the
wait. The deadline is the kernel's: SIGALRM at its default action ends the process. A rank whose peers are not up
yet (a node still copying the model's files, a rank still loading) is no broken model: its supervisor starts it
again at once, counted apart from load failures, until the ring forms or the instance is placed anew. This module
never imports mlx: the supervisor reads it in the node's process.
"""

import os
import signal
from collections.abc import Mapping
from typing import Final

RING_JOIN_TIMEOUT_VARIABLE: Final = "EXO_RING_JOIN_TIMEOUT"
"""Seconds a rank waits for the others to join its ring (a positive number; default `RING_JOIN_TIMEOUT_SECONDS`)."""
RING_JOIN_TIMEOUT_SECONDS: Final = 120.0
RING_NOT_FORMED_EXIT_CODE: Final = 75
"""The runner's exit code where mlx gave up connecting before the deadline (EX_TEMPFAIL: try again)."""


class RingNotFormedError(RuntimeError):
    """The other ranks did not join this rank's ring (not yet up, or gone)."""


def ring_join_timeout(environment: Mapping[str, str] | None = None) -> float:
    """The deadline from `EXO_RING_JOIN_TIMEOUT`, else the default; a malformed or non-positive value is refused."""
    value = (os.environ if environment is None else environment).get(RING_JOIN_TIMEOUT_VARIABLE, "").strip()
    if not value:
        return RING_JOIN_TIMEOUT_SECONDS
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise ValueError(f"{RING_JOIN_TIMEOUT_VARIABLE}={value!r}: give a positive number of seconds")
    return seconds


def ended_waiting_for_ring(exit_code: int | None) -> bool:
    """Whether a runner that exited with `exit_code` while loading was waiting for its ring's other ranks."""
    return exit_code in (RING_NOT_FORMED_EXIT_CODE, -signal.SIGALRM)
