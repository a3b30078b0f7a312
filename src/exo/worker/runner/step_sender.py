"""The serving loop's sender: each step's updates to the supervisor, a fast model's steps gathered into one message.

Every message wakes the supervisor's process, and on a small machine that process runs on the cores the model
computes on: measured on the 2-core stand-in (a 3.5 ms step, issue 36) the send and the wake-up it causes took
0.31-0.35 ms a step, a tenth of it. So streamed chunks wait here until STREAM_WINDOW_SECONDS have passed since the
last message, and go then in one. Nothing that decides latency waits: a task's first chunks (its first token), any
task's end, and everything before another message (a cancel's reply, a new task's progress) or before the loop
waits for work go at once, in the order the steps made them; so do chunks made before a step that prefills a prompt
(which can take seconds).
"""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from exo.shared.types.chunks import Chunk
from exo.shared.types.common import TaskId
from exo.shared.types.worker.runner_response import RunnerMemory, StepTimes
from exo.worker.runner.channel import RunnerChannel
from exo.worker.runner.task_replies import StepUpdate, send_step

STREAM_WINDOW_SECONDS: Final = 0.05
"""The longest a streamed chunk waits for the chunks of later steps: a message every 50 ms at most, 20 a second, still
a smooth stream to a reader (a person reads a few words a second). A model stepping in 3 ms sends every 16 or 17
steps; one stepping in 25 ms (the default model on a 2-core CPU) every second step, which halves the wake-ups of
the supervisor's process on the cores ggml's threads compute on; one stepping in 50 ms or more, every step."""


@dataclass(frozen=True)
class _Gathered:
    """A task's chunks from the steps since the last message (a `StepUpdate`)."""

    task_id: TaskId
    chunks: Sequence[Chunk]
    done: bool
    generated_tokens: int


class StepSender:
    """Sends a serving loop's step updates on `channel`, gathering streamed chunks for up to `window` seconds."""

    def __init__(
        self,
        channel: RunnerChannel,
        *,
        window: float = STREAM_WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._channel = channel
        self._window = window
        self._clock = clock
        self._held: dict[TaskId, tuple[list[Chunk], int]] = {}
        """Each task's chunks not yet sent (in order), and its token count as of the last of them."""
        self._streaming: set[TaskId] = set()
        """Tasks that have sent chunks: a task not in it sends its first ones at once."""
        self._last_send = clock()

    def step(
        self,
        updates: Sequence[StepUpdate],
        step_times: dict[int, StepTimes] | None = None,
        prefill_pieces: dict[int, int] | None = None,
        ggml_threads: int | None = None,
        memory: RunnerMemory | None = None,
        *,
        quick_next: bool = True,
    ) -> None:
        """One step's updates: held, or sent with everything held before them (`send_step` for the other
        arguments). `quick_next` False (the next step prefills a prompt, a second or more) sends them now."""
        first = False
        for update in updates:
            if update.chunks:
                chunks, _ = self._held.get(update.task_id, ([], 0))
                chunks.extend(update.chunks)
                self._held[update.task_id] = (chunks, update.generated_tokens)
                first = first or update.task_id not in self._streaming
        ending = any(update.done for update in updates)
        if ending or first or not quick_next or self._clock() - self._last_send >= self._window:
            self._send(updates, step_times, prefill_pieces, ggml_threads, memory)

    def flush(self) -> None:
        """Send every held chunk now (before another message, or before waiting for work)."""
        if self._held:
            self._send([], None, None, None, None)

    def _send(
        self,
        updates: Sequence[StepUpdate],
        step_times: dict[int, StepTimes] | None,
        prefill_pieces: dict[int, int] | None,
        ggml_threads: int | None,
        memory: RunnerMemory | None,
    ) -> None:
        done = {update.task_id for update in updates if update.done}
        gathered = [
            _Gathered(task_id=task_id, chunks=chunks, done=task_id in done, generated_tokens=tokens)
            for task_id, (chunks, tokens) in self._held.items()
        ]
        # A task that ended with no chunk in this step (its last ones sent before) still ends here.
        gathered += [
            _Gathered(task_id=update.task_id, chunks=[], done=True, generated_tokens=update.generated_tokens)
            for update in updates
            if update.done and update.task_id not in self._held
        ]
        self._streaming.update(self._held)
        self._streaming.difference_update(done)
        self._held.clear()
        self._last_send = self._clock()
        send_step(self._channel, gathered, step_times, prefill_pieces, ggml_threads=ggml_threads, memory=memory)
