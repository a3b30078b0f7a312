"""How the API reaches the master: `MasterClient` is everything the API may ask, `BusMasterClient` asks over the bus.

A completion is sent to the elected master (`PlaceTask`), which assigns it to a runner on some node; that node's
worker answers this node directly: Accepted or Refused, then numbered chunks, then StreamEnded. Whether the runner
is on this node or another, the path is the same, so a forwarded request streams exactly what a local one does.
"""

import contextlib
import logging
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Protocol

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from exo.cluster.bus import Bus
from exo.cluster.event_log import EventLog
from exo.cluster.membership import Membership, MembershipView
from exo.cluster.peers import PeerConnector
from exo.cluster.topics import Topics
from exo.shared.errors import ModelNotLoadedError, NoMasterError, QueueFullError, RunnerUnavailableError
from exo.shared.types.chunks import Chunk, ErrorChunk, FinishChunk
from exo.shared.types.cluster_api import DiscoveryReport, PeerConnection
from exo.shared.types.commands import CancelTaskCommand, GenerateCommand, PlaceTask, StopTask
from exo.shared.types.common import CommandId, ModelId, NodeId, RunnerId, TaskId
from exo.shared.types.instances import PlacedInstance
from exo.shared.types.request_record import RequestRecord
from exo.shared.types.state import State
from exo.shared.types.task_replies import (
    TaskAccepted,
    TaskChunkMessage,
    TaskRefused,
    TaskReply,
    TaskReplyAdapter,
    TaskStreamEnded,
)
from exo.shared.types.worker.shards import ParallelChoice

logger = logging.getLogger(__name__)

# Without an answer from any master for this long, the request fails with 503 (the cluster has no working master).
# A silent master is passed over after 8 s (cluster/event_log.py) and the command is sent again to its successor.
# Under the 10 s the cluster promises for any request to end after a fault: the 503 itself takes a moment to write.
ACCEPT_TIMEOUT_SECONDS = 9.0
# An unanswered command is sent again this often (and at once when the master changes); duplicates are stopped.
RESEND_SECONDS = 5.0
# The last chunk waits (at most this long) until this node's state shows the task ended, so a client that reads
# /state after its answer never sees its own finished task still listed.
SETTLE_SECONDS = 2.0


def refusal_error(refusal: TaskRefused, model_id: ModelId) -> Exception:
    """The domain error (exo.shared.errors) a refusal stands for; the API decides what it is on the wire."""
    match refusal.reason:
        case "queue_full":
            return QueueFullError(refusal.message)
        case "model_unavailable":
            return RunnerUnavailableError(refusal.message)
        case "model_not_found":
            return ModelNotLoadedError(model_id)


@dataclass
class TaskHandle:
    task_id: TaskId
    node_id: NodeId
    chunks: AsyncGenerator[Chunk, None]


class InstancePlacer(Protocol):
    async def place_instance(self, spec: str, min_nodes: int, parallel: ParallelChoice = "auto") -> PlacedInstance:
        """Place model `spec` over at least `min_nodes` nodes by memory, split as `parallel` says. Raises
        InstancePlacementError (it fits nowhere: the message names the memory needed and available; or its heads do
        not divide over a tensor split), NoMasterError, or why `spec` cannot be prepared."""
        ...


class MasterClient(InstancePlacer, Protocol):
    """What the API may ask of the cluster (a scripted stand-in serves the API tests)."""

    @property
    def node_id(self) -> NodeId: ...

    @property
    def cluster_name(self) -> str: ...

    @property
    def state(self) -> State:
        """This node's copy of the cluster state (the same on every node once events settle)."""
        ...

    async def submit_chat_completion(self, command: GenerateCommand) -> TaskHandle:
        """Run `command` somewhere in the cluster. When it cannot start this raises the reason from
        exo.shared.errors: ModelNotLoadedError, QueueFullError, RunnerUnavailableError or NoMasterError."""
        ...

    def cancel(self, command: CancelTaskCommand) -> None:
        """Stop a queued or running task (its client went away)."""
        ...

    def record_request(self, record: RequestRecord) -> None:
        """Put how a request this API took ended into the cluster state (this node's `recent_requests`)."""
        ...

    async def add_peer(self, endpoint: str) -> PeerConnection: ...

    async def discover(self) -> DiscoveryReport: ...


@dataclass
class _Pending:
    command: GenerateCommand
    sender: MemoryObjectSendStream[Chunk]
    receiver: MemoryObjectReceiveStream[Chunk]
    answered: anyio.Event = field(default_factory=anyio.Event)
    refusal: TaskRefused | None = None
    accepted: TaskAccepted | None = None
    abandoned: bool = False
    next_sequence: int = 0


class BusMasterClient:
    def __init__(
        self,
        bus: Bus,
        topics: Topics,
        membership: Membership,
        event_log: EventLog,
        peers: PeerConnector,
        *,
        placer: InstancePlacer,
        record_request: Callable[[RequestRecord], None],
    ) -> None:
        self._placer = placer
        self._record_request = record_request
        self._bus = bus
        self._topics = topics
        self._membership = membership
        self._event_log = event_log
        self._peers = peers
        self._by_command: dict[CommandId, _Pending] = {}
        self._by_task: dict[TaskId, _Pending] = {}
        # Why new requests are refused once the node began to stop (None while it serves).
        self._closed_because: str | None = None
        self._replies = bus.subscribe(topics.task_replies(membership.node_id), TaskReplyAdapter, inbox=True)
        membership.on_change(self._on_membership)

    @property
    def node_id(self) -> NodeId:
        return self._membership.node_id

    @property
    def cluster_name(self) -> str:
        return self._topics.cluster

    @property
    def state(self) -> State:
        return self._event_log.state

    async def run(self) -> None:
        """Route the replies addressed to this node to the requests waiting for them."""
        async with self._replies as replies:
            async for reply in replies:
                self._on_reply(reply)

    async def submit_chat_completion(self, command: GenerateCommand) -> TaskHandle:
        if self._closed_because is not None:
            raise RunnerUnavailableError(self._closed_because)
        sender, receiver = anyio.create_memory_object_stream[Chunk](max_buffer_size=float("inf"))
        pending = _Pending(command, sender, receiver)
        self._by_command[command.command_id] = pending
        try:
            with anyio.fail_after(ACCEPT_TIMEOUT_SECONDS):
                while not pending.answered.is_set():
                    self._send(pending)
                    with anyio.move_on_after(RESEND_SECONDS):
                        await pending.answered.wait()
        except TimeoutError:
            self._forget(pending)
            raise NoMasterError(f"no cluster master answered within {ACCEPT_TIMEOUT_SECONDS:.0f} s") from None
        except BaseException:
            # The client left while waiting: a task accepted after this point is stopped as soon as it is.
            pending.abandoned = True
            if pending.accepted is not None:
                self._stop(pending.accepted)
            self._forget(pending)
            raise
        if pending.refusal is not None:
            self._forget(pending)
            raise refusal_error(pending.refusal, command.model_id)
        accepted = pending.accepted
        assert accepted is not None
        return TaskHandle(task_id=accepted.task_id, node_id=accepted.node_id, chunks=self._chunks(pending, accepted))

    def cancel(self, command: CancelTaskCommand) -> None:
        pending = self._by_task.get(command.task_id)
        if pending is not None and pending.accepted is not None:
            self._stop(pending.accepted)

    def record_request(self, record: RequestRecord) -> None:
        self._record_request(record)

    async def add_peer(self, endpoint: str) -> PeerConnection:
        return await self._peers.add_peer(endpoint)

    async def discover(self) -> DiscoveryReport:
        return await self._peers.discover()

    async def place_instance(self, spec: str, min_nodes: int, parallel: ParallelChoice = "auto") -> PlacedInstance:
        return await self._placer.place_instance(spec, min_nodes, parallel)

    def stop_accepting(self, reason: str) -> None:
        """Refuse every request from now on with `reason` (503, model_unavailable): the node is stopping."""
        self._closed_because = reason

    def end_streams(self, reason: str) -> None:
        """End every request still waiting or streaming with a model_unavailable error saying `reason`, as a node
        that left ends them (the dialect writes it as its error event), and stop their tasks."""
        self.stop_accepting(reason)
        for pending in list(self._by_command.values()):
            accepted = pending.accepted
            if accepted is None:
                self._on_reply(
                    TaskRefused(command_id=pending.command.command_id, reason="model_unavailable", message=reason)
                )
            else:
                _end_with(pending, ErrorChunk(error="model_unavailable", message=reason))
                self._stop(accepted)

    # ---- replies ----------------------------------------------------------------------------

    def _send(self, pending: _Pending) -> None:
        master = self._membership.view.master
        if master is not None:
            place = PlaceTask(command=pending.command, requested_by=self.node_id)
            self._bus.publish(self._topics.master_commands(master), place)

    def _stop(self, accepted: TaskAccepted) -> None:
        self._bus.publish(self._topics.worker_commands(accepted.node_id), StopTask(task_id=accepted.task_id))

    def _on_reply(self, reply: TaskReply) -> None:
        match reply:
            case TaskAccepted(command_id=command_id):
                pending = self._by_command.get(command_id)
                if pending is None or pending.abandoned or pending.answered.is_set():
                    # Nobody waits for it any more, or a second master placed it again: stop the extra copy.
                    self._stop(reply)
                    return
                pending.accepted = reply
                self._by_task[reply.task_id] = pending
                pending.answered.set()
            case TaskRefused(command_id=command_id):
                pending = self._by_command.get(command_id)
                if pending is not None and not pending.answered.is_set():
                    pending.refusal = reply
                    pending.answered.set()
            case TaskChunkMessage(task_id=task_id, sequence=sequence, chunk=chunk):
                pending = self._by_task.get(task_id)
                if pending is not None and self._in_sequence(pending, sequence):
                    pending.next_sequence += 1
                    _deliver(pending, chunk)
            case TaskStreamEnded(task_id=task_id, sequence=sequence):
                pending = self._by_task.get(task_id)
                if pending is not None and self._in_sequence(pending, sequence):
                    pending.sender.close()

    def _in_sequence(self, pending: _Pending, sequence: int) -> bool:
        if sequence == pending.next_sequence:
            return True
        logger.error("chunks %d-%d of a task were lost on the way from its node", pending.next_sequence, sequence - 1)
        lost = "part of the answer was lost on the way from the node generating it"
        _end_with(pending, ErrorChunk(error="generation_failed", message=lost))
        return False

    def _on_membership(self, old: MembershipView, new: MembershipView) -> None:
        gone = old.live_nodes - new.live_nodes
        for pending in list(self._by_command.values()):
            accepted = pending.accepted
            if accepted is not None and accepted.node_id in gone:
                message = f"node {accepted.node_id}, which was generating this answer, left the cluster"
                _end_with(pending, ErrorChunk(error="node_left", message=message))
            elif accepted is None and new.master != old.master:
                self._send(pending)

    async def _chunks(self, pending: _Pending, accepted: TaskAccepted) -> AsyncGenerator[Chunk, None]:
        ended = False
        try:
            async with pending.receiver:
                async for chunk in pending.receiver:
                    if isinstance(chunk, FinishChunk | ErrorChunk) and self._closed_because is None:
                        # (A stopping node does not wait: its state may never show the task end.)
                        await self._event_log.wait_for(
                            lambda state: _task_settled(state, accepted.task_id, accepted.runner_id), SETTLE_SECONDS
                        )
                        ended = True
                    yield chunk
                ended = True
        finally:
            if not ended:
                # The reader gave up before the end (its client left): nobody wants the rest, so stop generating.
                self._stop(accepted)
            self._forget(pending)

    def _forget(self, pending: _Pending) -> None:
        pending.sender.close()
        self._by_command.pop(pending.command.command_id, None)
        if pending.accepted is not None:
            self._by_task.pop(pending.accepted.task_id, None)


def _end_with(pending: _Pending, error: ErrorChunk) -> None:
    """End the request's stream with `error` (its last chunk)."""
    _deliver(pending, error)
    pending.sender.close()


def _deliver(pending: _Pending, chunk: Chunk) -> None:
    # The stream may already have ended (or its reader gone away): the chunk has nobody to go to.
    with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
        pending.sender.send_nowait(chunk)


def _task_settled(state: State, task_id: TaskId, runner_id: RunnerId) -> bool:
    """The task's end has reached this node's state: its runner recorded it and it no longer counts as held."""
    runner = state.runners.get(runner_id)
    ended = runner is None or any(summary.task_id == task_id for summary in runner.recent_tasks)
    return ended and task_id not in state.tasks
