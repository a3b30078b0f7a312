"""Events: facts that happened in the cluster. The state is the fold of these, in the master's order.

A node reports what it owns (`LocalEvent`: its facts, runners and tasks, and how the requests its API took ended);
the elected master numbers those reports and adds the events only it can see (`MasterEvent`: who is master, which
nodes left or went quiet).
"""

from typing import Annotated, Literal

from pydantic import Field, TypeAdapter

from exo.shared.types.common import FrozenModel, InstanceId, ModelId, NodeId, TaskId
from exo.shared.types.instances import PendingPlacement, PlacedInstance
from exo.shared.types.preparation import ModelPreparation
from exo.shared.types.request_record import RequestRecord
from exo.shared.types.state import NodeFacts, RunnerInfo, TaskInfo


class NodeReported(FrozenModel):
    """Everything a node owns, in full: sent when it joins, every few seconds, and when a new master asks.

    Applying it replaces that node's runners and tasks, so anything a lost event left behind is repaired.
    """

    kind: Literal["node_reported"] = "node_reported"
    facts: NodeFacts
    preparing: tuple[str, ...] = ()
    preparations: dict[ModelId, ModelPreparation] = Field(default_factory=dict)
    runners: tuple[RunnerInfo, ...] = ()
    tasks: tuple[TaskInfo, ...] = ()
    recent_requests: tuple[RequestRecord, ...] = ()


class RunnerUpdated(FrozenModel):
    kind: Literal["runner_updated"] = "runner_updated"
    runner: RunnerInfo


class TaskUpdated(FrozenModel):
    kind: Literal["task_updated"] = "task_updated"
    task: TaskInfo


class TaskFinished(FrozenModel):
    kind: Literal["task_finished"] = "task_finished"
    task_id: TaskId


class PreparationUpdated(FrozenModel):
    """Progress (or the end) of preparing one of the reporting node's models."""

    kind: Literal["preparation_updated"] = "preparation_updated"
    preparation: ModelPreparation


class RequestEnded(FrozenModel):
    """A request the reporting node's API took has ended (however it ended)."""

    kind: Literal["request_ended"] = "request_ended"
    record: RequestRecord


class MasterElected(FrozenModel):
    """The first event a new master orders."""

    kind: Literal["master_elected"] = "master_elected"
    node_id: NodeId


class NodeDown(FrozenModel):
    """The node left (its liveliness token is gone): its runners and tasks leave the state, the node stays listed."""

    kind: Literal["node_down"] = "node_down"
    node_id: NodeId
    reason: str


class NodeStale(FrozenModel):
    """The node is connected but has reported nothing for too long: degraded until its next report."""

    kind: Literal["node_stale"] = "node_stale"
    node_id: NodeId
    silent_seconds: float


class InstancePlaced(FrozenModel):
    """The master placed a model over nodes: each of them starts its ranks."""

    kind: Literal["instance_placed"] = "instance_placed"
    instance: PlacedInstance


class InstanceRemoved(FrozenModel):
    """The instance is gone (one of its nodes left, or it was placed anew): its nodes stop their ranks."""

    kind: Literal["instance_removed"] = "instance_removed"
    instance_id: InstanceId
    reason: str


class PlacementPending(FrozenModel):
    """A model the cluster keeps placed has no instance now: its requests get a 503 with `pending.reason` until the
    master places it again (InstancePlaced clears it)."""

    kind: Literal["placement_pending"] = "placement_pending"
    pending: PendingPlacement


LocalEvent = Annotated[
    NodeReported | RunnerUpdated | TaskUpdated | TaskFinished | PreparationUpdated | RequestEnded,
    Field(discriminator="kind"),
]
MasterEvent = MasterElected | NodeDown | NodeStale | InstancePlaced | InstanceRemoved | PlacementPending
Event = Annotated[
    NodeReported
    | RunnerUpdated
    | TaskUpdated
    | TaskFinished
    | PreparationUpdated
    | RequestEnded
    | MasterElected
    | NodeDown
    | NodeStale
    | InstancePlaced
    | InstanceRemoved
    | PlacementPending,
    Field(discriminator="kind"),
]
EventAdapter: TypeAdapter[Event] = TypeAdapter(Event)
