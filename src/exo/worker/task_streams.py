"""Runs the tasks the master assigns to this node's runners and streams each one's replies to the node that asked.

The requesting node may be this one or another: either way the replies are published on the bus, so a forwarded
request gets exactly the chunks (tool calls, usage, errors) a local one does (a local one's are handed to its
inbox without zenoh, `Bus.subscribe`). If the requesting node leaves the
cluster, its tasks are cancelled: nobody is left to read them.
"""

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream

from exo.cluster.bus import Bus
from exo.cluster.membership import MembershipView
from exo.cluster.topics import Topics
from exo.shared.errors import QueueFullError, RunnerUnavailableError
from exo.shared.types.chunks import Chunk, ErrorChunk, FinishChunk, PrefillProgressChunk, Usage
from exo.shared.types.commands import AssignTask
from exo.shared.types.common import CommandId, NodeId, RunnerId, TaskId
from exo.shared.types.state import TaskOutcome
from exo.shared.types.task_replies import (
    RefusalReason,
    TaskAccepted,
    TaskChunkMessage,
    TaskRefused,
    TaskStreamEnded,
)
from exo.worker.runner.supervisor import RunnerSupervisor

logger = logging.getLogger(__name__)

# Assignments remembered to ignore a duplicate (a new master re-placing a command its predecessor already placed).
REMEMBERED_COMMANDS = 1024

TaskEnded = Callable[[RunnerId, TaskOutcome, "StreamTimings"], None]


@dataclass(frozen=True)
class StreamTimings:
    first_token_seconds: float | None
    decode_seconds: float | None
    usage: Usage | None


@dataclass(frozen=True)
class _Assigned:
    supervisor: RunnerSupervisor
    reply_to: NodeId


class TaskStreams:
    def __init__(self, bus: Bus, topics: Topics, node_id: NodeId, task_group: TaskGroup, on_end: TaskEnded) -> None:
        self._bus = bus
        self._topics = topics
        self._node_id = node_id
        self._task_group = task_group
        self._on_end = on_end
        self._assigned: dict[TaskId, _Assigned] = {}
        self._recent_commands: deque[CommandId] = deque(maxlen=REMEMBERED_COMMANDS)

    def requested_by(self, task_id: TaskId) -> NodeId:
        assigned = self._assigned.get(task_id)
        return assigned.reply_to if assigned is not None else self._node_id

    def start(self, assignment: AssignTask, supervisor: RunnerSupervisor | None) -> None:
        """Queue the task on its runner and answer Accepted (then stream), or Refused."""
        if assignment.command_id in self._recent_commands:
            logger.info("ignoring a second assignment of command %s", assignment.command_id)
            return
        self._recent_commands.append(assignment.command_id)
        if supervisor is None:
            message = f"runner {assignment.runner_id} is not on node {self._node_id}"
            self._refuse(assignment, "model_unavailable", message)
            return
        task_id = assignment.task.task_id
        # Registered before submitting: the supervisor reports the queued task (with its requester) at once.
        self._assigned[task_id] = _Assigned(supervisor, assignment.reply_to)
        try:
            chunks = supervisor.submit(assignment.task)
        except QueueFullError as error:
            del self._assigned[task_id]
            self._refuse(assignment, "queue_full", str(error))
            return
        except RunnerUnavailableError as error:
            del self._assigned[task_id]
            self._refuse(assignment, "model_unavailable", str(error))
            return
        accepted = TaskAccepted(
            command_id=assignment.command_id, task_id=task_id, node_id=self._node_id, runner_id=assignment.runner_id
        )
        self._bus.publish(self._topics.task_replies(assignment.reply_to), accepted)
        self._task_group.start_soon(self._stream, assignment, supervisor, chunks, name=f"stream-{task_id}")

    def stop(self, task_id: TaskId) -> None:
        """The client went away: drop the task from its queue or stop its generation."""
        assigned = self._assigned.get(task_id)
        if assigned is not None:
            assigned.supervisor.cancel(task_id)

    def on_membership(self, old: MembershipView, new: MembershipView) -> None:
        gone = old.live_nodes - new.live_nodes
        for task_id, assigned in list(self._assigned.items()):
            if assigned.reply_to in gone:
                logger.info("cancelling task %s: node %s, which asked for it, left", task_id, assigned.reply_to)
                assigned.supervisor.cancel(task_id)

    def _refuse(self, assignment: AssignTask, reason: RefusalReason, message: str) -> None:
        refusal = TaskRefused(command_id=assignment.command_id, reason=reason, message=message)
        self._bus.publish(self._topics.task_replies(assignment.reply_to), refusal)

    async def _stream(
        self, assignment: AssignTask, supervisor: RunnerSupervisor, chunks: MemoryObjectReceiveStream[Chunk]
    ) -> None:
        task_id = assignment.task.task_id
        replies = self._topics.task_replies(assignment.reply_to)
        accepted_at = time.monotonic()
        first_at: float | None = None
        last: Chunk | None = None
        sequence = 0
        try:
            async with chunks:
                async for chunk in chunks:
                    if not isinstance(chunk, PrefillProgressChunk):
                        first_at = first_at or time.monotonic()
                        last = chunk
                    self._bus.publish(replies, TaskChunkMessage(task_id=task_id, sequence=sequence, chunk=chunk))
                    sequence += 1
        finally:
            self._bus.publish(replies, TaskStreamEnded(task_id=task_id, sequence=sequence))
            self._assigned.pop(task_id, None)
        outcome: TaskOutcome = (
            "finished" if isinstance(last, FinishChunk) else "failed" if isinstance(last, ErrorChunk) else "cancelled"
        )
        # A cancelled task has no FinishChunk: its usage so far (tokens, withdrawn calls) comes from its runner.
        usage = last.usage if isinstance(last, FinishChunk) else supervisor.take_cancelled_usage(task_id)
        timings = StreamTimings(
            first_token_seconds=first_at - accepted_at if first_at is not None else None,
            decode_seconds=time.monotonic() - first_at if first_at is not None else None,
            usage=usage,
        )
        self._on_end(assignment.runner_id, outcome, timings)
