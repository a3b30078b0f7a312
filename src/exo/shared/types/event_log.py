"""The envelopes that carry events between nodes and the elected master."""

from typing import Literal

from pydantic import TypeAdapter

from exo.shared.types.common import FrozenModel, NodeId
from exo.shared.types.events import Event, LocalEvent
from exo.shared.types.state import State


class LocalEventMessage(FrozenModel):
    """A node's report about what it owns, sent to the master to be ordered."""

    kind: Literal["local_event"] = "local_event"
    origin: NodeId
    # Per-origin counter, for logs: reports from one node arrive in the order they were sent.
    sequence: int
    event: LocalEvent


class IndexedEvent(FrozenModel):
    """An event in the master's order: every node applies index 1, 2, 3… of its current master."""

    kind: Literal["indexed_event"] = "indexed_event"
    leader: NodeId
    index: int
    # The master's clock when it ordered the event: `last_seen` of the origin node.
    ordered_at: float
    origin: NodeId
    event: Event


class StateSnapshot(FrozenModel):
    """The master's state, for a node that joins, falls behind or sees a new master."""

    kind: Literal["state_snapshot"] = "state_snapshot"
    leader: NodeId
    state: State


class ResyncRequest(FrozenModel):
    """A new master asks every node to report in full (NodeReported) so its state is complete."""

    kind: Literal["resync_request"] = "resync_request"
    leader: NodeId


LocalEventMessageAdapter: TypeAdapter[LocalEventMessage] = TypeAdapter(LocalEventMessage)
IndexedEventAdapter: TypeAdapter[IndexedEvent] = TypeAdapter(IndexedEvent)
StateSnapshotAdapter: TypeAdapter[StateSnapshot] = TypeAdapter(StateSnapshot)
ResyncRequestAdapter: TypeAdapter[ResyncRequest] = TypeAdapter(ResyncRequest)
