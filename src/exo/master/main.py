"""The master role. Every node runs it; only the elected master (see cluster/membership.py) acts.

While elected it orders events (numbers every node's reports and publishes them as the one event log), answers
snapshot queries, marks nodes that leave down and nodes that go quiet degraded, and places each requested task on a
runner anywhere in the cluster. Its decisions are the pure functions of `exo.shared.apply` and
`exo.master.placement`; this module only moves messages.
"""

import logging
import random
import time
from collections.abc import Callable

import anyio

from exo.cluster.bus import Bus
from exo.cluster.event_log import EventLog
from exo.cluster.membership import Membership, MembershipView
from exo.cluster.topics import Topics
from exo.master.instance_placement import PORT_RANGE, place_instance, same_split_asked
from exo.master.pipeline_placement import PlacementError
from exo.master.placement import failed_replacements, instance_busy, instance_serving, no_runner_refusal, place_task
from exo.master.placement_hold import HeldPlacements
from exo.master.tensor_placement import IndivisibleHeadsError
from exo.shared.apply import apply, is_up
from exo.shared.types.commands import AssignTask, MasterCommandAdapter, PlaceTask
from exo.shared.types.common import InstanceId, ModelId, NodeId, new_command_id, new_instance_id, new_task_id
from exo.shared.types.event_log import (
    IndexedEvent,
    LocalEventMessage,
    LocalEventMessageAdapter,
    ResyncRequest,
    StateSnapshot,
)
from exo.shared.types.events import (
    Event,
    InstancePlaced,
    InstanceRemoved,
    LocalEvent,
    MasterElected,
    NodeDown,
    NodeReported,
    NodeStale,
    PlacementPending,
    PreparationUpdated,
    RequestEnded,
    RunnerUpdated,
    TaskFinished,
    TaskUpdated,
)
from exo.shared.types.instances import (
    InstancePlacementReply,
    PendingPlacement,
    PlacedInstance,
    PlaceInstance,
    PlacementRefusal,
)
from exo.shared.types.state import State
from exo.shared.types.task_replies import TaskRefused
from exo.shared.types.tasks import GenerationTask

logger = logging.getLogger(__name__)

# Nodes report every REPORT_INTERVAL_SECONDS (worker/main.py); three missed reports in a row make a node degraded.
STALE_AFTER_SECONDS = 15.0
SILENCE_CHECK_SECONDS = 2.0
# A degraded instance is retired this long after its replacement serves and once it has no task: a task assigned to
# it just before the replacement was ready reaches the state within this time, and is then waited for.
RETIRE_AFTER_SECONDS = 3.0
RETIRE_CHECK_SECONDS = 0.5
# How often a placement held for its figures (master/placement_hold.py) is checked again.
HOLD_CHECK_SECONDS = 0.2


def owned_by(event: LocalEvent, origin: NodeId, state: State) -> bool:
    """A node may only report what it owns: its own facts, runners and tasks."""
    match event:
        case NodeReported(facts=facts, runners=runners, tasks=tasks):
            return (
                facts.node_id == origin
                and all(runner.node_id == origin for runner in runners)
                and all(task.node_id == origin for task in tasks)
            )
        case RunnerUpdated(runner=runner):
            return runner.node_id == origin
        case TaskUpdated(task=task):
            return task.node_id == origin
        case TaskFinished(task_id=task_id):
            task = state.tasks.get(task_id)
            return task is None or task.node_id == origin
        case PreparationUpdated() | RequestEnded():
            return True  # it carries no node id: it is about the node that sent it


class Master:
    def __init__(
        self,
        bus: Bus,
        topics: Topics,
        membership: Membership,
        event_log: EventLog,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._bus = bus
        self._topics = topics
        self._membership = membership
        self._event_log = event_log
        self._clock = clock
        self._me = membership.node_id
        self._active = False
        # The authoritative state while this node is master: every event it orders is applied here first.
        self._state = State()
        self._last_sequence: dict[NodeId, int] = {}
        # Nodes already reported stale, with the last_seen they had then (reported again only after a new report).
        self._flagged_stale: dict[NodeId, float] = {}
        # Instances this master removed: their runners take no task while their nodes stop them.
        self._removed: set[InstanceId] = set()
        # When each replacement instance was first seen serving (its degraded predecessor is retired after that).
        self._serving_since: dict[InstanceId, float] = {}
        # Nodes asked for a full report (this node was elected, or they joined) that have not sent one, and since when
        # (monotonic): until they do, or go stale, a model without a runner here may be theirs (a 503, not a 404).
        self._unreported: dict[NodeId, float] = {}
        # `auto` placements waiting a moment for the figures of a node that just joined.
        self._holds = HeldPlacements()
        # Subscribed now, before anything runs, so no report sent during start-up is missed.
        self._reports = bus.subscribe(topics.local_events, LocalEventMessageAdapter)
        self._commands = bus.subscribe(topics.master_commands(self._me), MasterCommandAdapter)

    @property
    def active(self) -> bool:
        return self._active

    async def run(self) -> None:
        self._bus.answer_queries(self._topics.state, self._snapshot)
        self._membership.on_change(self._on_membership)
        if self._membership.is_master:
            self._activate()
        async with anyio.create_task_group() as group:
            group.start_soon(self._order_local_events)
            group.start_soon(self._place_tasks)
            group.start_soon(self._watch_for_silence)
            group.start_soon(self._retire_replaced)
            group.start_soon(self._place_held)

    # ---- election ---------------------------------------------------------------------------

    def _on_membership(self, old: MembershipView, new: MembershipView) -> None:
        if new.master == self._me and not self._active:
            self._activate()
            return
        if new.master != self._me and self._active:
            logger.info("node %s is now the cluster master; this node follows it", new.master)
            self._active = False
            self._holds.clear()
            return
        if self._active:
            for node_id in sorted(old.live_nodes - new.live_nodes):
                self._mark_down(node_id)
            joined = new.live_nodes - old.live_nodes
            self._holds.joined(joined)
            self._unreported.update(dict.fromkeys(joined, time.monotonic()))
            if joined:
                # A joining node may have reported before its token reached this node (and been ignored).
                self._bus.publish(self._topics.resync, ResyncRequest(leader=self._me))

    def _activate(self) -> None:
        self._state = self._event_log.state
        self._active = True
        self._flagged_stale.clear()
        live = self._membership.view.live_nodes
        self._unreported = dict.fromkeys(live, time.monotonic())
        self._holds.joined(live)
        logger.info("this node is the cluster master")
        self._order(MasterElected(node_id=self._me))
        for node_id in sorted(self._state.nodes):
            if node_id not in live:
                self._mark_down(node_id)
        # Whatever the previous master ordered last may not have reached this node: every node reports in full.
        self._bus.publish(self._topics.resync, ResyncRequest(leader=self._me))

    def _mark_down(self, node_id: NodeId) -> None:
        self._unreported.pop(node_id, None)
        if is_up(self._state, node_id):
            self._order(NodeDown(node_id=node_id, reason="left the cluster (its liveliness token is gone)"))
        for instance in list(self._state.instances.values()):
            if instance.ranks_on(node_id):
                # The survivors stop their ranks; the master places the model again over the nodes that remain.
                reason = f"node {node_id}, which ran a rank of it, left the cluster"
                self._order(InstanceRemoved(instance_id=instance.instance_id, reason=reason))
                if self._instance_of(instance.model_id, instance.files_from) is None:
                    self._place_again(instance, reason)
        for pending in list(self._state.pending_placements.values()):
            if pending.files_from == node_id:
                reason = f"node {node_id}, which holds the files of {pending.model_id}, left the cluster"
                self._pending(pending.model_id, node_id, pending.min_nodes, reason)

    # ---- the event log ----------------------------------------------------------------------

    def _order(self, event: Event, origin: NodeId | None = None) -> None:
        indexed = IndexedEvent(
            leader=self._me,
            index=self._state.last_event_index + 1,
            ordered_at=self._clock(),
            origin=origin or self._me,
            event=event,
        )
        self._state = apply(self._state, indexed)
        if isinstance(event, InstanceRemoved):
            self._removed.add(event.instance_id)
        if isinstance(event, NodeReported):
            self._unreported.pop(event.facts.node_id, None)
        self._bus.publish(self._topics.ordered_events, indexed)

    async def _order_local_events(self) -> None:
        async with self._reports as messages:
            async for message in messages:
                if self._active:
                    self._order_report(message)

    def _order_report(self, message: LocalEventMessage) -> None:
        origin = message.origin
        if origin not in self._membership.view.live_nodes:
            logger.debug("ignoring a report from %s, which is not (or no longer) a member", origin)
            return
        if not owned_by(message.event, origin, self._state):
            logger.warning("dropped a %s from %s about something it does not own", message.event.kind, origin)
            return
        expected = self._last_sequence.get(origin, message.sequence - 1) + 1
        self._last_sequence[origin] = message.sequence
        if message.sequence != expected:
            logger.info("reports %d-%d from %s were lost; asking for a full report", expected, message.sequence, origin)
            self._bus.publish(self._topics.resync, ResyncRequest(leader=self._me))
        self._order(message.event, origin)

    def _snapshot(self) -> StateSnapshot | None:
        """Answer a state query (on a zenoh thread) while master; a follower stays silent."""
        return StateSnapshot(leader=self._me, state=self._state) if self._active else None

    async def _watch_for_silence(self) -> None:
        while True:
            await anyio.sleep(SILENCE_CHECK_SECONDS)
            if not self._active:
                continue
            now = self._clock()
            for node_id, node in list(self._state.nodes.items()):
                silent = now - node.last_seen
                if node.health.status == "down" or node_id == self._me or silent < STALE_AFTER_SECONDS:
                    continue
                if self._flagged_stale.get(node_id) != node.last_seen:
                    self._flagged_stale[node_id] = node.last_seen
                    self._order(NodeStale(node_id=node_id, silent_seconds=round(silent, 1)))

    # ---- placement --------------------------------------------------------------------------

    async def _place_tasks(self) -> None:
        async with self._commands as commands:
            async for command in commands:
                if not self._active:
                    continue
                match command:
                    case PlaceTask():
                        self._place(command)
                    case PlaceInstance():
                        self._place_instance(command)

    def _place_instance(self, request: PlaceInstance, held_since: float | None = None) -> None:
        """Place a model over nodes by memory. A repeated request gets the instance already placed; one with another
        `min_nodes` replaces it only once the new placement is found (a refusal leaves it serving).

        Availability first: a request that `allow_fewer` is placed over the nodes that are up when fewer than
        `min_nodes` are (the instance is marked degraded), and a degraded instance is placed again over `min_nodes`
        as soon as that many are up. The degraded one keeps serving until its replacement does (make before break).
        An `auto` placement may wait a moment for the figures it weighs (held since `held_since`, placement_hold.py).
        """
        reply_to = self._topics.instance_replies(request.files_from)
        current = self._instance_of(request.model_id, request.files_from)
        up = sum(is_up(self._state, node_id) for node_id in self._state.nodes)
        can_spread = current is not None and current.degraded_reason is not None and up >= request.min_nodes
        same_split = current is not None and same_split_asked(current, request)
        if current is not None and current.min_nodes == request.min_nodes and same_split and not can_spread:
            self._bus.publish(reply_to, InstancePlacementReply(request_id=request.request_id, instance=current))
            return
        if self._holds.hold(self._state, request, held_since):
            return
        try:
            placed = self._plan(request, up)
        except PlacementError as error:
            logger.warning("cannot place %s: %s", request.model_id, error)
            if request.kept and current is None:
                self._pending(request.model_id, request.files_from, request.min_nodes, str(error))
            refusal: PlacementRefusal = (
                "indivisible_heads" if isinstance(error, IndivisibleHeadsError) else "insufficient_memory"
            )
            reply = InstancePlacementReply(request_id=request.request_id, error=str(error), refusal=refusal)
            self._bus.publish(reply_to, reply)
            return
        if current is not None and can_spread and current.min_nodes == request.min_nodes and same_split:
            placed = placed.model_copy(update={"replaces": current.instance_id})
        elif current is not None:
            reason = f"placed anew over at least {request.min_nodes} nodes ({placed.parallel} parallel)"
            self._order(InstanceRemoved(instance_id=current.instance_id, reason=reason))
        layers = ", ".join(f"{rank.node_id} {rank.start_layer}-{rank.end_layer - 1}" for rank in placed.ranks)
        degraded = f" (degraded: {placed.degraded_reason})" if placed.degraded_reason else ""
        logger.info(
            "placed %s as instance %s (%s parallel): %s%s",
            placed.model_id,
            placed.instance_id,
            placed.parallel,
            layers,
            degraded,
        )
        self._order(InstancePlaced(instance=placed))
        self._bus.publish(reply_to, InstancePlacementReply(request_id=request.request_id, instance=placed))

    async def _place_held(self) -> None:
        while True:
            await anyio.sleep(HOLD_CHECK_SECONDS)
            for request, since in self._holds.take() if self._active else []:
                self._place_instance(request, since)

    def _place_again(self, lost: PlacedInstance, reason: str) -> None:
        """Availability first, whoever is master: an instance that lost a node is placed again at once over the nodes
        that are up (degraded when fewer than it asks for), without waiting for the node holding its files to ask:
        that node may be this master, whose own request could race the node's departure, or be down itself."""
        request = PlaceInstance(
            request_id=new_command_id(),
            model_id=lost.model_id,
            min_nodes=lost.min_nodes,
            parallel=lost.parallel,
            footprint=lost.footprint,
            files_from=lost.files_from,
            allow_fewer=True,
            kept=True,
        )
        up = sum(is_up(self._state, node_id) for node_id in self._state.nodes)
        try:
            placed = self._plan(request, up)
        except PlacementError as error:
            logger.warning("cannot place %s again: %s", lost.model_id, error)
            self._pending(lost.model_id, lost.files_from, lost.min_nodes, f"{reason}; {error}")
            return
        if lost.parallel_reason is not None:  # the reason its split was chosen (`auto` or asked for) still holds
            placed = placed.model_copy(update={"parallel_reason": lost.parallel_reason})
        placed = placed.model_copy(update={"parallel_asked": lost.parallel_asked})
        layers = ", ".join(f"{rank.node_id} {rank.start_layer}-{rank.end_layer - 1}" for rank in placed.ranks)
        degraded = f" (degraded: {placed.degraded_reason})" if placed.degraded_reason else ""
        logger.info("placed %s again as instance %s: %s%s", placed.model_id, placed.instance_id, layers, degraded)
        self._order(InstancePlaced(instance=placed))

    def _plan(self, request: PlaceInstance, up: int) -> PlacedInstance:
        """The instance for `request` over the nodes up now (fewer than `min_nodes` if it allows, marked degraded)."""
        if not is_up(self._state, request.files_from):
            raise PlacementError(f"node {request.files_from}, which holds the files of {request.model_id}, is down")
        spread = min(request.min_nodes, up) if request.allow_fewer else request.min_nodes
        planned = place_instance(
            self._state,
            request.model_copy(update={"min_nodes": max(spread, 1)}),
            new_instance_id(),
            now=self._clock(),
            draw_ports=_draw_ports,
        )
        placed = planned.model_copy(update={"min_nodes": request.min_nodes})
        if len(placed.ranks) < request.min_nodes:
            reason = f"on {len(placed.ranks)} of the {request.min_nodes} nodes asked for: only {up} node(s) are up"
            placed = placed.model_copy(update={"degraded_reason": reason})
        return placed

    def _instance_of(self, model_id: ModelId, files_from: NodeId) -> PlacedInstance | None:
        """The newest instance of `model_id` placed for `files_from` (a replacement is newer than what it replaces)."""
        mine = [
            instance
            for instance in self._state.instances.values()
            if instance.model_id == model_id and instance.files_from == files_from
        ]
        return max(mine, key=lambda instance: instance.placed_at, default=None)

    def _pending(self, model_id: ModelId, files_from: NodeId, min_nodes: int, reason: str) -> None:
        """Record why `model_id` has no instance (once per reason: a retry with the same outcome orders nothing)."""
        known = self._state.pending_placements.get(model_id)
        if known is not None and known.reason == reason and known.files_from == files_from:
            return
        pending = PendingPlacement(
            model_id=model_id, files_from=files_from, min_nodes=min_nodes, reason=reason, since=self._clock()
        )
        self._order(PlacementPending(pending=pending))

    async def _retire_replaced(self) -> None:
        """Remove each degraded instance once its replacement has served a while and it has no task left (and a
        replacement whose rank failed, so that it is placed again)."""
        while True:
            await anyio.sleep(RETIRE_CHECK_SECONDS)
            if not self._active:
                continue
            now = time.monotonic()
            for instance_id, error in failed_replacements(self._state).items():
                reason = f"a rank of it failed ({error}); it is placed again while the degraded instance serves"
                logger.warning("instance %s: %s", instance_id, reason)
                self._order(InstanceRemoved(instance_id=instance_id, reason=reason))
            for instance in list(self._state.instances.values()):
                old = instance.replaces
                if old is None or old not in self._state.instances:
                    self._serving_since.pop(instance.instance_id, None)
                    continue
                if not instance_serving(self._state, instance):
                    continue
                since = self._serving_since.setdefault(instance.instance_id, now)
                if now - since < RETIRE_AFTER_SECONDS or instance_busy(self._state, old):
                    continue
                reason = f"replaced by instance {instance.instance_id} over the {instance.min_nodes} nodes asked for"
                logger.info("instance %s of %s: %s", old, instance.model_id, reason)
                self._order(InstanceRemoved(instance_id=old, reason=reason))
                self._serving_since.pop(instance.instance_id, None)

    def _place(self, place: PlaceTask) -> None:
        command = place.command
        runner = place_task(self._state, command.model_id, self._removed)
        if runner is None:
            now = time.monotonic()
            unreported = [node for node, since in self._unreported.items() if now - since < STALE_AFTER_SECONDS]
            reason, message = no_runner_refusal(self._state, command.model_id, unreported)
            refusal = TaskRefused(command_id=command.command_id, reason=reason, message=message)
            self._bus.publish(self._topics.task_replies(place.requested_by), refusal)
            return
        task = GenerationTask(
            task_id=new_task_id(), command_id=command.command_id, model_id=command.model_id, params=command.params
        )
        assignment = AssignTask(
            command_id=command.command_id, task=task, runner_id=runner.runner_id, reply_to=place.requested_by
        )
        self._bus.publish(self._topics.worker_commands(runner.node_id), assignment)


def _draw_ports(count: int) -> list[int]:
    return random.sample(range(*PORT_RANGE), count)
