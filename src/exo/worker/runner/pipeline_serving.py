"""How a runner that is one rank of a pipeline serves: rank 0 takes the supervisor's tasks and decodes them together
over every rank (`PipelineBatchLeader`); the other ranks follow each step rank 0 hands them and never talk to their
supervisor about tasks.

Idle, every rank waits on its pipe and its task connections at once (no CPU). A rank that goes away ends the
pipeline: each survivor returns the reason, and its process exits so that its supervisor restarts it (the ranks find
each other again when all are back) or, in a cluster, the instance is placed anew.
"""

import contextlib
import logging
from collections.abc import Callable
from multiprocessing.connection import wait
from typing import TYPE_CHECKING

from exo.shared.types.chunks import Chunk, ErrorChunk
from exo.shared.types.tasks import GenerationTask
from exo.shared.types.worker.runner_response import (
    CancelTask,
    GgmlThreadsReport,
    RunnerRequest,
    RunTask,
    Shutdown,
    TaskChunk,
    TaskDone,
)
from exo.worker.engines.mlx.cpu.core_share import current_ggml_threads
from exo.worker.runner.channel import RunnerChannel
from exo.worker.runner.idle_snapshots import write_snapshots_while_idle
from exo.worker.runner.memory_reports import LEAVE_REPORT_SECONDS, MemoryReports
from exo.worker.runner.pipeline_link import PipelineLink
from exo.worker.runner.task_replies import report_cancel, send_step

if TYPE_CHECKING:
    from exo.worker.engines.mlx.distributed.batch_leader import PipelineBatchLeader
    from exo.worker.engines.mlx.generator.request_context import EngineContext

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


def _serve_leader(
    channel: RunnerChannel, context: "EngineContext", link: PipelineLink, incoming: Incoming
) -> str | None:
    """Admit tasks, cancel them and advance every active one a step at a time until shut down or broken.

    Messages are read between steps, so a task arriving while others decode joins them and a cancel takes effect
    within one step.
    """
    from exo.worker.engines.mlx.distributed.batch_leader import PipelineBatchLeader
    from exo.worker.engines.mlx.distributed.task_channel import EndPipeline, PeerLostError, send_message
    from exo.worker.runner.idle_turns import IdleTurns

    leader = PipelineBatchLeader(
        context.loaded,
        link.connections,
        prefill_step_size=context.decode.prefill_step_size,
        prefix_cache=context.prefix_cache,
    )
    followers = list(link.connections.values())
    turns = IdleTurns()
    memory = MemoryReports(channel, context.prefix_cache)
    while True:
        if not leader.busy:
            if context.prefix_cache is not None:
                write_snapshots_while_idle(context.prefix_cache, channel.poll)
            turns.idle()
            memory.report()
            ready = wait([channel.fileno(), *followers])
            lost = [rank for rank, connection in link.connections.items() if connection in ready]
            if lost:
                return f"rank {lost[0]} left the pipeline"
        for request in incoming(False):
            match request:
                case RunTask(task=task):
                    _admit(channel, context, leader, task)
                case CancelTask(task_id=task_id):
                    report_cancel(channel, task_id, leader.cancel(task_id))
                case Shutdown():
                    for connection in followers:
                        with contextlib.suppress(PeerLostError):
                            send_message(connection, EndPipeline())
                    return None
                case _:
                    pass
        if not leader.busy:
            continue
        turns.working()
        updates = leader.step()
        # ggml's thread count (None without ggml) and the runner's memory go with each task's end, as a single node's
        # runner sends them.
        if any(update.done for update in updates):
            send_step(channel, updates, ggml_threads=current_ggml_threads(), memory=memory.at_task_end())
        else:
            send_step(channel, updates)
        if leader.broken is not None:
            return leader.broken


def _admit(
    channel: RunnerChannel, context: "EngineContext", leader: "PipelineBatchLeader", task: GenerationTask
) -> None:
    """Hand a task to the batch, or answer it at once (the error that keeps it from starting, or a prompt count)."""
    from exo.worker.engines.mlx.generator.chat_completion import ChatRequest
    from exo.worker.engines.mlx.generator.request_context import ImmediateReplyError

    reply: Chunk
    try:
        leader.admit(ChatRequest.open(context, task))
        return
    except ImmediateReplyError as immediate:
        reply = immediate.chunk
    except Exception as error:
        logger.exception("task %s could not start", task.task_id)
        reply = ErrorChunk(error="generation_failed", message=f"generation failed: {type(error).__name__}: {error}")
    channel.send(TaskChunk(task_id=task.task_id, chunk=reply))
    channel.send(TaskDone(task_id=task.task_id))


def _serve_follower(
    channel: RunnerChannel, context: "EngineContext", link: PipelineLink, incoming: Incoming
) -> str | None:
    from exo.worker.engines.mlx.distributed.batch_follower import PipelineBatchFollower
    from exo.worker.engines.mlx.distributed.task_channel import BatchStep, EndPipeline, PeerLostError, receive_message
    from exo.worker.runner.idle_turns import IdleTurns

    follower = PipelineBatchFollower(context.loaded, context.prefix_cache)
    leader = link.connections[0]
    turns = IdleTurns()
    memory = MemoryReports(channel, context.prefix_cache)
    threads_sent: int | None = None  # each report is a node event: sent when the count changed
    while True:
        if context.prefix_cache is not None and follower.active == 0:
            write_snapshots_while_idle(context.prefix_cache, lambda: channel.poll() or leader.poll())
        if follower.active == 0:
            turns.idle()
            memory.report()
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
            case BatchStep():
                turns.working()
                follower.apply(message)
                if message.leaves:  # a task ended: what rank 0 sends with its TaskDones, this rank sends alone
                    if (threads := current_ggml_threads()) is not None and threads != threads_sent:
                        channel.send(GgmlThreadsReport(threads=threads))
                        threads_sent = threads
                    memory.report(at_most_every=LEAVE_REPORT_SECONDS)
            case EndPipeline():
                return None
            case _:
                pass
