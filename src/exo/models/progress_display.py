"""Show model preparation on the console: a bar on a terminal (bytes, rate, time left), plain log lines otherwise."""

import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from rich.console import Console
from rich.filesize import decimal
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from exo.shared.types.common import ModelId
from exo.shared.types.preparation import ModelPreparation

logger = logging.getLogger("exo.progress")

LINE_INTERVAL_SECONDS = 10.0
"""Without a terminal, one line per phase change and at most one every this many seconds in between."""


def describe_preparation(snapshot: ModelPreparation) -> str:
    """One line: `downloading qwen2.5-coder-1.5b-instruct: 230.1 MB of 1.1 GB (21%), 35.2 MB/s, 25 s left`."""
    name = f"{snapshot.phase} {snapshot.model_id}"
    if snapshot.phase == "failed":
        return f"{name}: {snapshot.error}"
    if snapshot.total_bytes <= 0:
        return name
    percent = 100 * snapshot.done_bytes / snapshot.total_bytes
    text = f"{name}: {decimal(snapshot.done_bytes)} of {decimal(snapshot.total_bytes)} ({percent:.0f}%)"
    if snapshot.phase == "ready":
        return f"{snapshot.model_id} ready ({decimal(snapshot.total_bytes)})"
    if snapshot.bytes_per_second:
        text += f", {decimal(int(snapshot.bytes_per_second))}/s"
    if snapshot.seconds_left is not None:
        text += f", {snapshot.seconds_left:.0f} s left"
    return text


@dataclass
class _LineState:
    phase: str
    logged_at: float
    closed: bool


class ConsoleProgress:
    """A preparation sink: rich progress bars when `stream` is a terminal, else log lines every few seconds."""

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        terminal: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        output = stream if stream is not None else sys.stderr
        self._terminal = output.isatty() if terminal is None else terminal
        self._clock = clock
        self._lock = threading.Lock()
        self._lines: dict[ModelId, _LineState] = {}
        self._bars: Progress | None = None
        self._tasks: dict[tuple[ModelId, str], TaskID] = {}
        self._active: set[ModelId] = set()
        if self._terminal:
            self._bars = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                console=Console(file=output),
            )

    def __call__(self, snapshot: ModelPreparation) -> None:
        with self._lock:
            if self._bars is None:
                self._log_line(snapshot)
            else:
                self._draw(self._bars, snapshot)

    def close(self) -> None:
        """Stop drawing bars (the last state stays on screen)."""
        with self._lock:
            if self._bars is not None:
                self._bars.stop()

    def _log_line(self, snapshot: ModelPreparation) -> None:
        now = self._clock()
        state = self._lines.get(snapshot.model_id)
        complete = snapshot.done_bytes >= snapshot.total_bytes
        if (
            state is not None
            and state.phase == snapshot.phase
            and (state.closed or not (complete or now - state.logged_at >= LINE_INTERVAL_SECONDS))
        ):
            return
        level = logging.ERROR if snapshot.phase == "failed" else logging.INFO
        logger.log(level, "%s", describe_preparation(snapshot))
        self._lines[snapshot.model_id] = _LineState(phase=snapshot.phase, logged_at=now, closed=complete)

    def _draw(self, bars: Progress, snapshot: ModelPreparation) -> None:
        if snapshot.phase in ("ready", "failed"):
            self._active.discard(snapshot.model_id)
            if snapshot.phase == "failed":
                bars.console.print(describe_preparation(snapshot))
            if not self._active:
                bars.stop()
            return
        self._active.add(snapshot.model_id)
        key = (snapshot.model_id, snapshot.phase)
        task = self._tasks.get(key)
        if task is None:
            bars.start()
            task = bars.add_task(f"{snapshot.phase} {snapshot.model_id}", total=snapshot.total_bytes)
            self._tasks[key] = task
        bars.update(task, completed=snapshot.done_bytes, total=snapshot.total_bytes)
