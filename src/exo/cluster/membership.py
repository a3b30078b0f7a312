"""Who is in the cluster, and who is master, from zenoh liveliness tokens.

Each node session holds one token, `members/<node id>/<start time in ms>`. A token disappears when its session
closes, or when its node stops answering for the transport lease (LEASE_MILLISECONDS): that is how a node that
crashed, froze or lost its network is noticed. The master is a pure function of the tokens every node sees, so
nodes agree on it without a vote once their views agree.

A token counts only once the node it names confirms it: its session (exo's zenoh id is its node id, and zenoh
reports which session replied) answers a query with the same start time. A token with no node behind it, with a
malformed id, or declared on another node's behalf is ignored, so it cannot make anyone follow a phantom master. A
master that orders nothing for LEADER_SILENCE_SECONDS (every live master orders each node's report, every 5 s) is
passed over by the nodes that notice, until it is heard from again.
"""

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskGroup
from pydantic import TypeAdapter

from exo.cluster.bus import Bus
from exo.cluster.topics import Member, Topics
from exo.shared.types.common import FrozenModel, NodeId

logger = logging.getLogger(__name__)

# How long a node has to confirm its token, and how often an unconfirmed token is asked about again (the node may
# declare its token a moment before it answers).
CLAIM_TIMEOUT_SECONDS = 2.0
CLAIM_RETRY_SECONDS = 1.0
CLAIM_ATTEMPTS = 3
# A flood of forged tokens is checked no more than this many at a time; the rest are ignored.
MAX_UNCONFIRMED = 64


class MemberClaim(FrozenModel):
    """A node's answer about its own session: the start time its token carries."""

    node_id: NodeId
    started_at_ms: int


MemberClaimAdapter: TypeAdapter[MemberClaim] = TypeAdapter(MemberClaim)


def member_claim(member: Member) -> MemberClaim:
    return MemberClaim(node_id=member.node_id, started_at_ms=member.started_at_ms)


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
    # Live nodes passed over in the election: they were master and ordered nothing for too long.
    distrusted: frozenset[NodeId] = field(default_factory=frozenset)

    @property
    def live_nodes(self) -> frozenset[NodeId]:
        return frozenset(member.node_id for member in self.members)

    @property
    def master(self) -> NodeId | None:
        return elect_master(member for member in self.members if member.node_id not in self.distrusted)


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
        # Tokens being checked with the node they name: not members until it confirms them.
        self._unconfirmed: set[Member] = set()

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
        claim = member_claim(self.me)
        self._bus.answer_queries(self._topics.member_claim(self.me.node_id), lambda: claim)
        self._bus.declare_token(self._topics.member(self.me))
        async with anyio.create_task_group() as group:
            async with self._bus.watch_liveliness(self._topics.members) as changes:
                async for alive, key in changes:
                    self._on_token(alive, key, group)
            group.cancel_scope.cancel()

    def distrust(self, node_id: NodeId, reason: str) -> None:
        """Pass over `node_id` in the election (it is master and silent) until `trust` is called for it."""
        if node_id in self.view.distrusted or node_id == self.me.node_id:
            return
        logger.warning("passing over master %s: %s", node_id, reason)
        self._change(MembershipView(self.view.members, self.view.distrusted | {node_id}))

    def trust(self, node_id: NodeId) -> None:
        """`node_id` was heard from again: it may be elected again."""
        if node_id in self.view.distrusted:
            logger.info("node %s orders events again; it may be master again", node_id)
            self._change(MembershipView(self.view.members, self.view.distrusted - {node_id}))

    def _on_token(self, alive: bool, key: str, group: TaskGroup) -> None:
        member = self._topics.parse_member(key)
        if member is None:
            logger.warning("ignoring a liveliness token that is not an exo member: %.120s", key)
            return
        if member == self.me:
            return  # this node knows it is alive
        if not alive:
            self._unconfirmed.discard(member)
            members = self.view.members - {member}
            live = {member.node_id for member in members}
            self._change(MembershipView(members, self.view.distrusted & live))
        elif member not in self._unconfirmed and len(self._unconfirmed) < MAX_UNCONFIRMED:
            self._unconfirmed.add(member)
            group.start_soon(self._confirm, member)

    async def _confirm(self, member: Member) -> None:
        """Admit `member` once its own session confirms its start time; give up after a few tries."""
        key = self._topics.member_claim(member.node_id)
        for _ in range(CLAIM_ATTEMPTS):
            replies = await self._bus.query_repliers(key, MemberClaimAdapter, CLAIM_TIMEOUT_SECONDS)
            if member not in self._unconfirmed:
                return  # its token went meanwhile
            if any(
                replier == member.node_id and claim.started_at_ms == member.started_at_ms for replier, claim in replies
            ):
                self._unconfirmed.discard(member)
                self._change(MembershipView(self.view.members | {member}, self.view.distrusted))
                return
            await anyio.sleep(CLAIM_RETRY_SECONDS)
        self._unconfirmed.discard(member)
        logger.warning(
            "ignoring the token of %s (started at %d): no session of that node confirms it",
            member.node_id,
            member.started_at_ms,
        )

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
