"""The round trip from this node to each peer, measured over the cluster's own transport and published in the
node's facts (NodeFacts.links), for placement's `auto` rule (master/split_choice.py).

Every node answers queries on its probe key at once with its id. A node times PROBE_SAMPLES queries to each live
peer's probe, one after another, and keeps the median: when a peer joins (at once) and every PROBE_INTERVAL_SECONDS
after. A query goes through zenoh as every cluster message does (TLS on a keyed cluster, through a relay where the
nodes meet through one), so the figure is the link plus both nodes' zenoh and thread hand-over: at least the raw
link's round trip, never less. Only the peer's own session counts as a reply (zenoh names who replied), so no other
node can answer for it. A peer that does not answer within PROBE_TIMEOUT_SECONDS keeps no figure; a peer that
left is forgotten. Once a round of probes ends, the node reports its facts at once (`after_measuring`): the master
holds a placement over a node that just joined for these figures (master/placement_hold.py).
"""

import logging
import statistics
import time
from collections.abc import Callable

import anyio
from pydantic import TypeAdapter

from exo.cluster.bus import Bus
from exo.cluster.membership import Membership, MembershipView
from exo.cluster.topics import Topics
from exo.shared.types.common import FrozenModel, NodeId
from exo.shared.types.links import LinkMeasurement

logger = logging.getLogger(__name__)

PROBE_SAMPLES = 5
PROBE_TIMEOUT_SECONDS = 2.0
PROBE_INTERVAL_SECONDS = 15.0


class ProbeReply(FrozenModel):
    node_id: NodeId


ProbeReplyAdapter: TypeAdapter[ProbeReply] = TypeAdapter(ProbeReply)


class LinkProber:
    """Measures and holds the round trip to each live peer; `measurements()` is what the node's facts publish."""

    def __init__(
        self, bus: Bus, topics: Topics, membership: Membership, *, timeout_seconds: float = PROBE_TIMEOUT_SECONDS
    ) -> None:
        self._bus = bus
        self._timeout = timeout_seconds
        self._topics = topics
        self._membership = membership
        self._links: dict[NodeId, LinkMeasurement] = {}
        self._joined = anyio.Event()
        self._measured: Callable[[], None] | None = None
        membership.on_change(self._on_change)

    def after_measuring(self, callback: Callable[[], None]) -> None:
        """Call `callback` (publish the node's facts) after each round of probes that measured a peer."""
        self._measured = callback

    def measurements(self) -> dict[NodeId, LinkMeasurement]:
        return dict(self._links)

    async def run(self) -> None:
        me = self._membership.node_id
        reply = ProbeReply(node_id=me)
        self._bus.answer_queries(self._topics.link_probe(me), lambda: reply)
        while True:
            await self.measure_all()
            with anyio.move_on_after(PROBE_INTERVAL_SECONDS):
                await self._joined.wait()
            self._joined = anyio.Event()

    async def measure_all(self) -> None:
        """Measure every live peer now; forget the ones that left."""
        peers = sorted(self._membership.view.live_nodes - {self._membership.node_id})
        for gone in set(self._links) - set(peers):
            del self._links[gone]
        for peer in peers:
            measured = await self.measure(peer)
            if measured is not None:
                self._links[peer] = measured
            elif peer in self._links and peer in self._membership.view.live_nodes:
                logger.info("no probe reply from %s within %.1f s: its round trip is unknown", peer, self._timeout)
                del self._links[peer]
        if peers and self._measured is not None:
            self._measured()

    async def measure(self, peer: NodeId) -> LinkMeasurement | None:
        """The median of PROBE_SAMPLES round trips to `peer`, or None when it answered none of them."""
        key = self._topics.link_probe(peer)
        trips: list[float] = []
        for _ in range(PROBE_SAMPLES):
            trip = await self._bus.round_trip(key, ProbeReplyAdapter, peer, self._timeout)
            if trip is not None:
                trips.append(trip)
        if not trips:
            return None
        return LinkMeasurement(
            round_trip_ms=round(statistics.median(trips) * 1000, 3), samples=len(trips), measured_at=time.time()
        )

    def _on_change(self, old: MembershipView, new: MembershipView) -> None:
        if new.live_nodes - old.live_nodes:
            self._joined.set()
