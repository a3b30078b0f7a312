"""What a serving loop (one node's scheduler or a pipeline's rank 0) sends its supervisor as its tasks move on."""

import logging
from collections.abc import Sequence
from typing import Protocol

from exo.shared.types.chunks import Chunk, Usage
from exo.shared.types.common import TaskId
from exo.shared.types.worker.runner_response import RunnerMemory, StepOutput, StepTimes, StreamChunks, TaskDone
from exo.worker.runner.channel import RunnerChannel

logger = logging.getLogger(__name__)


class StepUpdate(Protocol):
    """What a step produced for one task (the scheduler's `RequestUpdate`, or several steps' gathered)."""

    @property
    def task_id(self) -> TaskId: ...
    @property
    def chunks(self) -> Sequence[Chunk]: ...
    @property
    def done(self) -> bool:
        """The last chunk is the task's Finish or Error chunk."""
        ...

    @property
    def generated_tokens(self) -> int: ...


def send_step(
    channel: RunnerChannel,
    updates: Sequence[StepUpdate],
    step_times: dict[int, StepTimes] | None = None,
    prefill_pieces: dict[int, int] | None = None,
    *,
    ggml_threads: int | None = None,
    memory: RunnerMemory | None = None,
) -> None:
    """A step's updates as one message (nothing when the step produced nothing): every task's chunks, the last with
    its running token count, then the end of each task that finished. `step_times` (the host-overhead meter),
    `prefill_pieces` (prompt pieces fed so far, by prompts fed together), `ggml_threads` (ggml's thread count now) and
    `memory` (the runner's) go with each end."""
    streams = [
        StreamChunks(task_id=update.task_id, chunks=list(update.chunks), generated_tokens=update.generated_tokens)
        for update in updates
        if update.chunks
    ]
    endings = [
        TaskDone(
            task_id=update.task_id,
            generated_tokens=update.generated_tokens,
            step_times=step_times,
            prefill_pieces=prefill_pieces,
            ggml_threads=ggml_threads,
            memory=memory,
        )
        for update in updates
        if update.done
    ]
    if streams or endings:
        channel.send(StepOutput(streams=streams, endings=endings))


def report_cancel(channel: RunnerChannel, task_id: TaskId, usage: Usage | None) -> None:
    """End a cancelled task with its usage so far; `usage` None means it had already ended, so there is nothing to
    say."""
    if usage is not None:
        logger.info("task %s cancelled after %d generated tokens", task_id, usage.completion_tokens)
        channel.send(TaskDone(task_id=task_id, generated_tokens=usage.completion_tokens, cancelled=True, usage=usage))
