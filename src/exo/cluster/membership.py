"""Who is in the cluster, and who is master, from zenoh liveliness tokens.

Each node session holds one token, `members/<node id>/<start time in ms>`. A token disappears when its session
closes, or when its node stops answering for the transport lease (LEASE_MILLISECONDS): that is how a node that
crashed, froze or lost its network is noticed. The master is a pure function of the tokens every node sees, so
nodes agree on it without a vote once their views agree.
"""

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from exo.cluster.bus import Bus
from exo.cluster.topics import Member, Topics
from exo.shared.types.common import NodeId

logger = logging.getLogger(__name__)


def elect_master(members: Iterable[Member]) -> NodeId | None:
    """The longest-running session wins (earliest start, then smallest id).

    A node that joins or restarts starts later than the sitting master, so it never displaces it; when the master
    leaves, the next-oldest node takes over.
    """
    oldest = min(members, key=lambda member: (member.started_at_ms, member.node_id), default=None)
    return oldest.node_id if oldest is not None else None


@dataclass(frozen=True)
class MembershipView:
    members: frozenset[Member] = field(default_factory=frozenset)

    @property
    def live_nodes(self) -> frozenset[NodeId]:
        return frozenset(member.node_id for member in self.members)

    @property
    def master(self) -> NodeId | None:
        return elect_master(self.members)


MembershipListener = Callable[[MembershipView, MembershipView], None]


class Membership:
    """Holds this node's token and the current view; tells listeners (old view, new view) on every change."""

    def __init__(self, bus: Bus, topics: Topics, me: Member) -> None:
        self._bus = bus
        self._topics = topics
        self.me = me
        # This node is a member before any token arrives: alone, it is its own master at once.
        self.view = MembershipView(frozenset({me}))
        self._listeners: list[MembershipListener] = []

    @property
    def node_id(self) -> NodeId:
        return self.me.node_id

    @property
    def is_master(self) -> bool:
        return self.view.master == self.me.node_id

    def on_change(self, listener: MembershipListener) -> None:
        self._listeners.append(listener)

    async def run(self) -> None:
        """Announce this node and follow every other node's arrivals and departures until the bus closes."""
        self._bus.declare_token(self._topics.member(self.me))
        async with self._bus.watch_liveliness(self._topics.members) as changes:
            async for alive, key in changes:
                member = self._topics.parse_member(key)
                if member is None:
                    logger.warning("ignoring a liveliness token that is not an exo member: %s", key)
                    continue
                if member == self.me:
                    continue  # this node knows it is alive
                members = self.view.members | {member} if alive else self.view.members - {member}
                self._change(MembershipView(members))

    def _change(self, new: MembershipView) -> None:
        old, self.view = self.view, new
        if old == new:
            return
        joined = new.live_nodes - old.live_nodes
        left = old.live_nodes - new.live_nodes
        if joined or left:
            logger.info(
                "cluster membership: %d node(s)%s%s; master %s",
                len(new.live_nodes),
                f", joined {', '.join(sorted(joined))}" if joined else "",
                f", left {', '.join(sorted(left))}" if left else "",
                new.master,
            )
        for listener in self._listeners:
            listener(old, new)
