"""How long an idle runner waits for more requests after the first one arrives, so that requests sent together are
admitted together and prefilled in one grouped pass (`generator/group_prefill.py`).

Clients that send several requests at once reach the runner spread over some milliseconds (each passes the API's
parsing and chat template first). A request admitted alone at an idle runner is prefilled and decoded a step before
the ones right behind it are even read, and those then wait for that step and their own prefill: the last one's
first token comes one prefill and one step after the first one's. Waiting up to about one decode step for the rest
costs a lone request at most that step, and lets a burst start together. Each arrival within the window opens it
again (a burst keeps coming in for longer than one step under load), up to `MAX_TOTAL_SECONDS` after the first.

The window is measured against the runner's own recent decode steps (a step of one request alone), bounded on both
sides: at least `MIN_SECONDS`, so a burst still coalesces before anything was measured or where a step takes
microseconds, and at most `MAX_SECONDS`, so a slow model never makes a lone request wait long.
"""

from typing import Final

MIN_SECONDS: Final = 0.002
MAX_SECONDS: Final = 0.05
MAX_TOTAL_SECONDS: Final = 0.1
"""The longest the first request of a burst waits for the rest, however long they keep arriving."""
FIRST_STEP_SECONDS: Final = 0.01
"""The window before any lone decode step was measured."""
SMOOTHING: Final = 0.2
"""Weight of the newest step in the running average (steps vary by load; one outlier must not set the window)."""


class ArrivalWindow:
    """The runner's recent lone decode step, and the coalescing window it sets."""

    def __init__(self) -> None:
        self._step_seconds: float | None = None

    def record_step(self, seconds: float) -> None:
        """A decode step in which one request decoded took `seconds`."""
        previous = self._step_seconds
        self._step_seconds = seconds if previous is None else previous + SMOOTHING * (seconds - previous)

    def deadline(self, first: float, last: float) -> float:
        """When to stop reading arrivals (monotonic time): one window after the `last` arrival, at most
        `MAX_TOTAL_SECONDS` after the `first`."""
        return min(last + self.seconds, first + MAX_TOTAL_SECONDS)

    @property
    def seconds(self) -> float:
        """How long to keep reading arrivals after the first request reaches an idle runner."""
        step = FIRST_STEP_SECONDS if self._step_seconds is None else self._step_seconds
        return min(MAX_SECONDS, max(MIN_SECONDS, step))
