"""How a runner that is one rank of a pipeline serves: rank 0 takes the supervisor's tasks one at a time and runs
them over every rank; the other ranks follow the tasks rank 0 hands them and never talk to their supervisor about
tasks.

Idle, every rank waits on its pipe and its task connections at once (no CPU). A rank that goes away ends the
pipeline: each survivor returns the reason, and its process exits so that its supervisor restarts it (the ranks find
each other again when all are back) or, in a cluster, the instance is placed anew.
"""

import contextlib
import logging
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import TYPE_CHECKING

from exo.shared.types.chunks import ErrorChunk
from exo.shared.types.common import TaskId
from exo.shared.types.tasks import ChatCompletionTask
from exo.shared.types.worker.runner_response import (
    CancelTask,
    RunnerRequest,
    RunTask,
    Shutdown,
    TaskChunk,
    TaskDone,
)
from exo.worker.runner.channel import RunnerChannel
from exo.worker.runner.idle_snapshots import write_snapshots_while_idle
from exo.worker.runner.pipeline_link import PipelineLink

if TYPE_CHECKING:
    from exo.worker.engines.mlx.distributed.leader import PipelineLeader
    from exo.worker.engines.mlx.generator.chat_completion import EngineContext

logger = logging.getLogger(__name__)

Incoming = Callable[[bool], list[RunnerRequest]]
"""The runner's reader: every message waiting on the pipe (blocking for one when asked); a closed pipe reads as a
Shutdown."""


def serve_pipeline(
    channel: RunnerChannel, context: "EngineContext", link: PipelineLink, incoming: Incoming
) -> str | None:
    """Serve until shut down (returns None) or until the pipeline breaks (returns why)."""
    if link.is_leader:
        return _serve_leader(channel, context, link, incoming)
    return _serve_follower(channel, context, link, incoming)


class _TaskControl:
    """Read between tokens: a cancel of the running task, a shutdown, or tasks to run after it."""

    def __init__(
        self, channel: RunnerChannel, task_id: TaskId, incoming: Incoming, queued: deque[ChatCompletionTask]
    ) -> None:
        self._channel = channel
        self._task_id = task_id
        self._incoming = incoming
        self._queued = queued
        self.cancelled = False
        self.shutdown = False

    def should_cancel(self) -> bool:
        for request in self._incoming(False):
            match request:
                case CancelTask(task_id=task_id) if task_id == self._task_id:
                    self.cancelled = True
                case CancelTask(task_id=task_id):
                    for waiting in [task for task in self._queued if task.task_id == task_id]:
                        self._queued.remove(waiting)
                        self._channel.send(TaskDone(task_id=task_id, cancelled=True))
                case RunTask(task=task):
                    self._queued.append(task)
                case Shutdown():
                    self.shutdown = self.cancelled = True
                case _:
                    pass
        return self.cancelled


def _serve_leader(
    channel: RunnerChannel, context: "EngineContext", link: PipelineLink, incoming: Incoming
) -> str | None:
    from exo.worker.engines.mlx.distributed.leader import PipelineLeader
    from exo.worker.engines.mlx.distributed.task_channel import EndPipeline, PeerLostError, send_message

    leader = PipelineLeader(context.loaded, link.connections, prefill_step_size=context.decode.prefill_step_size)
    followers = list(link.connections.values())
    queued: deque[ChatCompletionTask] = deque()
    while True:
        if not queued:
            if context.prefix_cache is not None:
                write_snapshots_while_idle(context.prefix_cache, channel.poll)
            ready = wait([channel.fileno(), *followers])
            lost = [rank for rank, connection in link.connections.items() if connection in ready]
            if lost:
                return f"rank {lost[0]} left the pipeline"
            for request in incoming(False):
                match request:
                    case RunTask(task=task):
                        queued.append(task)
                    case Shutdown():
                        for connection in followers:
                            with contextlib.suppress(PeerLostError):
                                send_message(connection, EndPipeline())
                        return None
                    case _:
                        pass  # nothing runs: a late cancel needs no action
        if queued:
            task = queued.popleft()
            shutdown = _run_leader_task(channel, context, leader, task, incoming=incoming, queued=queued)
            if leader.broken is not None:
                return leader.broken
            if shutdown:
                return None


def _run_leader_task(
    channel: RunnerChannel,
    context: "EngineContext",
    leader: "PipelineLeader",
    task: ChatCompletionTask,
    *,
    incoming: Incoming,
    queued: deque[ChatCompletionTask],
) -> bool:
    """Run one task over the pipeline and report it done; returns whether a shutdown arrived meanwhile."""
    from exo.worker.engines.mlx.generator.chat_completion import ChatRequest, ImmediateReplyError

    try:
        request = ChatRequest.open(context, task)
    except ImmediateReplyError as immediate:
        channel.send(TaskChunk(task_id=task.task_id, chunk=immediate.chunk))
        channel.send(TaskDone(task_id=task.task_id))
        return False
    except Exception as error:
        logger.exception("task %s could not start", task.task_id)
        failure = ErrorChunk(error="generation_failed", message=f"generation failed: {type(error).__name__}: {error}")
        channel.send(TaskChunk(task_id=task.task_id, chunk=failure))
        channel.send(TaskDone(task_id=task.task_id))
        return False
    control = _TaskControl(channel, task.task_id, incoming, queued)
    for chunk in leader.run(request, control.should_cancel):
        channel.send(TaskChunk(task_id=task.task_id, chunk=chunk))
    generated = len(request.generated)
    if control.cancelled:
        logger.info("task %s cancelled after %d generated tokens", task.task_id, generated)
    channel.send(TaskDone(task_id=task.task_id, generated_tokens=generated, cancelled=control.cancelled))
    return control.shutdown


def _serve_follower(
    channel: RunnerChannel, context: "EngineContext", link: PipelineLink, incoming: Incoming
) -> str | None:
    from exo.worker.engines.mlx.distributed.follower import follow_task
    from exo.worker.engines.mlx.distributed.task_channel import (
        EndPipeline,
        FollowTask,
        PeerLostError,
        receive_message,
    )

    leader = link.connections[0]
    while True:
        if context.prefix_cache is not None:
            write_snapshots_while_idle(context.prefix_cache, lambda: channel.poll() or leader.poll())
        ready = wait([channel.fileno(), leader])
        if channel.fileno() in ready and any(isinstance(request, Shutdown) for request in incoming(False)):
            return None
        if leader not in ready:
            continue
        try:
            message = receive_message(leader)
        except PeerLostError:
            return "rank 0 left the pipeline"
        match message:
            case FollowTask():
                followed = follow_task(context.loaded, context.prefix_cache, message, context.decode.prefill_step_size)
                logger.info(
                    "followed task %s: %s, %d cached prompt tokens, %d tokens",
                    message.task.task_id,
                    followed.outcome.name.lower(),
                    followed.cached_tokens,
                    followed.generated_tokens,
                )
            case EndPipeline():
                return None
            case _:
                pass
