"""This node's copy of the cluster state: the current master's events, applied strictly in index order.

Events from any other sender are ignored. A gap in the indices, or a new master, makes the node fetch the
master's snapshot and continue from it (events that arrive meanwhile are buffered), so every node converges on
the master's state. The state is never reset while that happens: the node keeps serving from what it knows.
"""

import logging
import time
from collections.abc import Callable

import anyio

from exo.cluster.bus import Bus
from exo.cluster.membership import Membership, MembershipView
from exo.cluster.topics import Topics
from exo.shared.apply import apply
from exo.shared.types.common import NodeId
from exo.shared.types.event_log import IndexedEvent, IndexedEventAdapter, StateSnapshotAdapter
from exo.shared.types.state import State

logger = logging.getLogger(__name__)

SNAPSHOT_TIMEOUT_SECONDS = 2.0
SNAPSHOT_RETRY_SECONDS = 0.5
# A master orders every node's report (each node reports every 5 s), so a master silent this long is not working:
# it is passed over in the election (see Membership.distrust), and a request waits on it no longer than this.
LEADER_SILENCE_SECONDS = 8.0
LEADER_CHECK_SECONDS = 0.5


class EventLog:
    def __init__(self, bus: Bus, topics: Topics, membership: Membership) -> None:
        self._bus = bus
        self._topics = topics
        self._me = membership.node_id
        self._membership = membership
        self.state = State()
        # When this node last heard from its master (or started following it), on the monotonic clock.
        self._leader_heard_at = time.monotonic()
        self._leader: NodeId | None = membership.view.master
        self._buffer: dict[int, IndexedEvent] = {}
        # This node's own master continues from this node's state; any other master's snapshot is needed first.
        self._syncing = self._leader != self._me
        self._sync_wanted = anyio.Event()
        if self._syncing:
            self._sync_wanted.set()
        self._changed = anyio.Event()
        # Subscribed now, before anything runs, so no event published during start-up is missed.
        self._events = bus.subscribe(topics.ordered_events, IndexedEventAdapter)
        membership.on_change(self._on_membership)

    @property
    def leader(self) -> NodeId | None:
        return self._leader

    async def run(self) -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(self._receive)
            group.start_soon(self._sync_when_wanted)
            group.start_soon(self._watch_leader)

    async def wait_for(self, condition: Callable[[State], bool], timeout: float) -> bool:
        """Wait until `condition(state)` holds; False if it still does not after `timeout` seconds."""
        with anyio.move_on_after(timeout):
            while not condition(self.state):
                await self._changed.wait()
            return True
        return False

    def _on_membership(self, old: MembershipView, new: MembershipView) -> None:
        if new.master == old.master:
            return
        self._leader = new.master
        self._leader_heard_at = time.monotonic()
        self._buffer.clear()
        if self._leader != self._me:
            self._request_sync()

    async def _receive(self) -> None:
        async with self._events as events:
            async for event in events:
                if event.leader == self._leader:
                    self._leader_heard_at = time.monotonic()
                elif event.leader in self._membership.view.distrusted:
                    self._membership.trust(event.leader)
                if event.leader != self._leader:
                    logger.debug("ignoring event %d from %s, which is not the master", event.index, event.leader)
                elif self._syncing:
                    self._buffer[event.index] = event
                else:
                    self._accept(event)

    async def _watch_leader(self) -> None:
        """Pass over a master that orders nothing (a phantom, or a node that hangs while its link stays up)."""
        while True:
            await anyio.sleep(LEADER_CHECK_SECONDS)
            leader = self._leader
            silent = time.monotonic() - self._leader_heard_at
            if leader is not None and leader != self._me and silent > LEADER_SILENCE_SECONDS:
                self._membership.distrust(leader, f"it has ordered no event for {silent:.0f} s")

    def _accept(self, event: IndexedEvent) -> None:
        expected = self.state.last_event_index + 1
        if event.index < expected:
            return  # already applied (it was in the snapshot)
        if event.index > expected:
            logger.info("missed events %d-%d from the master; fetching its state", expected, event.index - 1)
            self._buffer[event.index] = event
            self._request_sync()
            return
        self._set_state(apply(self.state, event))
        self._drain_buffer()

    def _drain_buffer(self) -> None:
        state = self.state
        for index in sorted(self._buffer):
            if index <= state.last_event_index:
                del self._buffer[index]
            elif index == state.last_event_index + 1:
                state = apply(state, self._buffer.pop(index))
            else:
                break
        self._set_state(state)

    def _request_sync(self) -> None:
        self._syncing = True
        self._sync_wanted.set()

    async def _sync_when_wanted(self) -> None:
        while True:
            await self._sync_wanted.wait()
            self._sync_wanted = anyio.Event()
            while self._syncing:
                leader = self._leader
                snapshots = await self._bus.query(self._topics.state, StateSnapshotAdapter, SNAPSHOT_TIMEOUT_SECONDS)
                snapshot = next((snapshot for snapshot in snapshots if snapshot.leader == leader), None)
                if snapshot is not None and leader == self._leader:
                    self._syncing = False
                    self._set_state(snapshot.state)
                    self._drain_buffer()
                    if self._buffer:
                        self._request_sync()  # still a hole between the snapshot and what arrived since
                else:
                    await anyio.sleep(SNAPSHOT_RETRY_SECONDS)

    def _set_state(self, state: State) -> None:
        if state is self.state:
            return
        self.state = state
        self._changed.set()
        self._changed = anyio.Event()
