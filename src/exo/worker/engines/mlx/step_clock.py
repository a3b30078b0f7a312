"""Where a runner's decode step spends its time, by part: the measuring side of the host-overhead meter.

The serving loop opens a step; code along the step marks what it does (`with STEP_CLOCK.part("send"):`) and the
step's time is split among the parts. Parts nest exclusively: time inside an inner part counts for it alone (a
grammar waiting for the sampled token it must consume counts that wait as "device", not "processors"). Time in no
part at all is the loop's own: scheduling, bookkeeping, sampling setup.

"device" is time the host thread is blocked waiting for the model's evaluation; everything else is host work. The
runner runs one serving loop on one thread, so one clock per process is enough (`STEP_CLOCK`): it measures the thread
that began the step. Work another thread does for the step while the loop goes on (a step's tokens accepted beside
the next launch, `generator/beside.py`) is off the loop's critical path: its parts are not the loop's, and its time is
added up apart (`add_beside`).
"""

import threading
import time
from types import TracebackType
from typing import Final, Literal

StepPart = Literal[
    "device", "prefill", "messages", "admit", "graph", "launch", "processors", "detokenize", "parse", "send", "beside"
]
"""device: waiting on the model's evaluation. prefill: feeding prompt pieces (model work, not per-token overhead).
messages: reading the supervisor's messages. admit: opening a new request (its prompt, its grammar). graph: building the
next forward pass and its sampling as mlx's lazy graph in Python (a call per layer; mlx-lm's own loop does the same
work, and on an accelerator it overlaps the pass before). launch: in
`mx.async_eval`, starting the next forward pass (on mlx's CPU backend this call can itself run much of the pass before
it returns: a batched step measured so, with almost no wait left after it). processors:
grammar masks and penalties. detokenize: token ids to text. parse: the rest of turning tokens into chunks (tool
calls, reasoning, stop sequences). send: the runner→API channel (encoding a step's one message and queueing it for the
channel's writer thread, metered as the first part of the next step: the message carries the meter's totals through
its own step). beside: work a helper thread did for the step while the loop went on (not the loop's, not host work on
its critical path; the loop's wait for it, if any, is parse)."""


class StepClock:
    """Seconds per part since the step began; parts nest, each second counting for the innermost open part."""

    def __init__(self) -> None:
        self._seconds: dict[StepPart, float] = {}
        self._open: list[StepPart] = []
        self._since = time.perf_counter()
        self._started = self._since
        self._parts: dict[StepPart, _Part] = {}
        self._thread = threading.get_ident()
        self._beside = 0.0

    def begin(self) -> None:
        """Start a step: forget what the last one measured."""
        self._seconds = {}
        self._open = []
        self._thread = threading.get_ident()
        self._beside = 0.0
        self._started = self._since = time.perf_counter()

    def part(self, name: StepPart) -> "_Part":
        """`with STEP_CLOCK.part(name):` counts the block's time for `name` (one reusable context manager per
        part: a step opens a dozen, and a generator-based one cost several microseconds each)."""
        opened = self._parts.get(name)
        if opened is None:
            opened = self._parts[name] = _Part(self, name)
        return opened

    def open_part(self, name: StepPart) -> None:
        """What entering `part(name)` does (leaving it calls `close_part`); nothing on another thread than the
        step's."""
        if threading.get_ident() != self._thread:
            return
        self._switch()
        self._open.append(name)

    def close_part(self) -> None:
        """Leave the innermost open part (nothing on another thread than the step's)."""
        if threading.get_ident() != self._thread:
            return
        self._switch()
        self._open.pop()

    def add_beside(self, seconds: float) -> None:
        """Another thread worked `seconds` for this step while the loop went on (a float added under the
        interpreter's lock; the loop reads it only after waiting for that work)."""
        self._beside += seconds

    def end(self) -> tuple[float, dict[StepPart, float]]:
        """The step's wall time and its seconds by part (parts with none left out); work beside the loop is "beside"."""
        self._switch()
        seconds = dict(self._seconds)
        if self._beside:
            seconds["beside"] = self._beside
        return self._since - self._started, seconds

    def _switch(self) -> None:
        now = time.perf_counter()
        if self._open:
            name = self._open[-1]
            self._seconds[name] = self._seconds.get(name, 0.0) + (now - self._since)
        self._since = now


class _Part:
    """Entering opens the part on its clock, leaving closes it; holds no state of its own, so it nests and is
    reused."""

    __slots__ = ("_clock", "_name")

    def __init__(self, clock: StepClock, name: StepPart) -> None:
        self._clock = clock
        self._name: StepPart = name

    def __enter__(self) -> None:
        self._clock.open_part(self._name)

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._clock.close_part()


STEP_CLOCK: Final = StepClock()
