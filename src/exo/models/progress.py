"""Progress of long model work: the callback steps report to, and the tracker that turns it into snapshots.

Steps (download, GGUF assembly, conversion) call a `ProgressCallback` with bytes done and total, as often as they
like. A `PreparationTracker` adds the rate and time left and passes `ModelPreparation` snapshots on, at most a few
times a second, to whoever shows them: a terminal bar or log lines (`progress_display`), and /state.
"""

import threading
import time
from collections.abc import Callable, Sequence

from exo.shared.types.common import ModelId
from exo.shared.types.preparation import ModelPreparation, PreparationPhase, ProgressUpdate, WorkPhase

ProgressCallback = Callable[[ProgressUpdate], None]
PreparationSink = Callable[[ModelPreparation], None]

MIN_PUBLISH_INTERVAL_SECONDS = 0.25


def no_progress(_update: ProgressUpdate) -> None:
    """A callback for callers that show no progress."""


class ByteCounter:
    """Counts bytes of one phase and reports them; a step with several sources shares one counter."""

    def __init__(self, phase: WorkPhase, total_bytes: int, progress: ProgressCallback) -> None:
        self.phase: WorkPhase = phase
        self.total_bytes = total_bytes
        self.done_bytes = 0
        self._progress = progress
        progress(ProgressUpdate(phase=phase, done_bytes=0, total_bytes=total_bytes))

    def add(self, byte_count: int) -> None:
        self.done_bytes += byte_count
        self._progress(ProgressUpdate(phase=self.phase, done_bytes=self.done_bytes, total_bytes=self.total_bytes))


class PreparationTracker:
    """A `ProgressCallback` for one model that publishes `ModelPreparation` snapshots to `sinks`.

    Thread-safe: the work runs in a worker thread while the node's event loop reads nothing from here.
    """

    def __init__(
        self,
        model_id: ModelId,
        sinks: Sequence[PreparationSink],
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.model_id = model_id
        self._sinks = tuple(sinks)
        self._clock = clock
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        self._started_at = wall_clock()
        self._phase_started = clock()
        self._last_published = float("-inf")
        self._last: ModelPreparation | None = None
        self._latest: ProgressUpdate | None = None  # the newest update, published or not

    @property
    def last(self) -> ModelPreparation | None:
        """The latest snapshot published, or None before the first update."""
        return self._last

    def __call__(self, update: ProgressUpdate) -> None:
        with self._lock:
            self._latest = update
            now = self._clock()
            new_phase = self._last is None or self._last.phase != update.phase
            if new_phase:
                self._phase_started = now
            finished = update.done_bytes >= update.total_bytes
            if not (new_phase or finished or now - self._last_published >= MIN_PUBLISH_INTERVAL_SECONDS):
                return
            elapsed = now - self._phase_started
            rate = update.done_bytes / elapsed if elapsed > 0 and update.done_bytes > 0 else None
            left = (update.total_bytes - update.done_bytes) / rate if rate else None
            snapshot = self._snapshot(update.phase, update.done_bytes, update.total_bytes, rate, left)
            self._last_published = now
        self._publish(snapshot)

    def finish(self) -> None:
        """Publish that the model is ready (whether or not any long step ran)."""
        latest = self._latest
        total = latest.total_bytes if latest else 0
        self._publish(self._snapshot("ready", total, total, None, None))

    def fail(self, error: str) -> None:
        """Publish that preparing the model failed, keeping how far it got."""
        latest = self._latest
        done, total = (latest.done_bytes, latest.total_bytes) if latest else (0, 0)
        self._publish(self._snapshot("failed", done, total, None, None).model_copy(update={"error": error}))

    def _snapshot(
        self, phase: PreparationPhase, done: int, total: int, rate: float | None, left: float | None
    ) -> ModelPreparation:
        return ModelPreparation(
            model_id=self.model_id,
            phase=phase,
            done_bytes=done,
            total_bytes=total,
            bytes_per_second=rate,
            seconds_left=left,
            started_at=self._started_at,
            updated_at=self._wall_clock(),
        )

    def _publish(self, snapshot: ModelPreparation) -> None:
        self._last = snapshot
        for sink in self._sinks:
            sink(snapshot)
