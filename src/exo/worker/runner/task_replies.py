"""What a serving loop (one node's scheduler or a pipeline's rank 0) sends its supervisor as its tasks move on."""

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from exo.shared.types.common import TaskId
from exo.shared.types.worker.runner_response import StepTimes, TaskChunk, TaskDone
from exo.worker.runner.channel import RunnerChannel

if TYPE_CHECKING:
    from exo.worker.engines.mlx.generator.scheduler import RequestUpdate

logger = logging.getLogger(__name__)


def send_updates(channel: RunnerChannel, updates: Sequence["RequestUpdate"]) -> None:
    """Each update's chunks (the last with the task's running token count), then the end of each task that
    finished."""
    send_chunks(channel, updates)
    send_endings(channel, updates)


def send_chunks(channel: RunnerChannel, updates: Iterable["RequestUpdate"]) -> None:
    for update in updates:
        for position, chunk in enumerate(update.chunks, start=1):
            last = position == len(update.chunks)
            count = update.generated_tokens if last else None
            channel.send(TaskChunk(task_id=update.task_id, chunk=chunk, generated_tokens=count))


def send_endings(
    channel: RunnerChannel,
    updates: Iterable["RequestUpdate"],
    step_times: dict[int, StepTimes] | None = None,
    prefill_pieces: dict[int, int] | None = None,
) -> None:
    """The end of each task that finished, after its chunks were sent; `step_times` is the host-overhead meter and
    `prefill_pieces` the prompt pieces fed so far by prompts fed together."""
    for update in updates:
        if update.done:
            done = TaskDone(
                task_id=update.task_id,
                generated_tokens=update.generated_tokens,
                step_times=step_times,
                prefill_pieces=prefill_pieces,
            )
            channel.send(done)


def report_cancel(channel: RunnerChannel, task_id: TaskId, generated: int | None) -> None:
    """End a cancelled task; `generated` None means it had already ended, so there is nothing to say."""
    if generated is not None:
        logger.info("task %s cancelled after %d generated tokens", task_id, generated)
        channel.send(TaskDone(task_id=task_id, generated_tokens=generated, cancelled=True))
