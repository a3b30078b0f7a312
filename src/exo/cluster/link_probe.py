"""The round trip from this node to each peer, measured over the cluster's own transport and published in the
node's facts (NodeFacts.links), for placement's `auto` rule (master/split_choice.py).

Every node answers queries on its probe key at once with its id. A node times PROBE_SAMPLES queries to each live
peer's probe, one after another, and keeps the median: when a peer joins (at once) and every PROBE_INTERVAL_SECONDS
after. A query goes through zenoh as every cluster message does (TLS on a keyed cluster, through a relay where the
nodes meet through one), so the figure is the link plus both nodes' zenoh and thread hand-over: at least the raw
link's round trip, never less. Only the peer's own session counts as a reply (zenoh names who replied), so no other
node can answer for it. A peer that does not answer within PROBE_TIMEOUT_SECONDS keeps no figure; a peer that
left is forgotten.

The bandwidth from a peer to this node is timed in the same way: BANDWIDTH_SAMPLES queries to the peer's bulk probe,
among the small ones, whose reply carries BULK_PAYLOAD_BYTES of random text more than the small one's (random, so
that nothing on the way can compress it), at join and every BANDWIDTH_INTERVAL_SECONDS after (it costs under a MiB
a peer). The extra bytes over the extra time (the fastest bulk trip less the fastest small trip: a busy moment only
adds time) is the figure: it includes carrying and checking the larger reply at both ends, so it is at most the raw
link's bandwidth, never more. Where the bulk trips were not slower (a link too fast, or a moment too busy, for the
difference to show) the last figure stands (none at first), and the next round times it again.

A peer is measured again SETTLE_ROUNDS_SECONDS after the round that first saw it (bandwidth included), and until
the last of those rounds its figures are the best of the rounds so far (the least round trip, the most bandwidth)
and are published as `settling`. The round at join runs while both nodes are busy with the join itself (the event
log catching up, the master's hand-over, reports, a starting node's API), and on a loaded machine those moments add
milliseconds to every trip: two nodes on one 2-core machine measured 2.8-155 ms bulk trips and a 15 ms median round
trip at join against 0.6-0.8 ms and 0.3-0.4 ms one second later (docs/PERFORMANCE.md, "The link figures at join").

Once a round of probes ends, the node reports its facts at once (`after_measuring`): the master
holds a placement over a node that just joined for these figures, settled (master/placement_hold.py).
"""

import logging
import secrets
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
BANDWIDTH_SAMPLES = 3
BANDWIDTH_INTERVAL_SECONDS = 60.0
BULK_PAYLOAD_BYTES = 256 * 1024
SETTLE_ROUNDS_SECONDS: tuple[float, ...] = (1.0, 3.0)
"""When a joined peer is measured again, after the round that first saw it: the join's busy moments had passed by the
first on a loaded 2-core machine; the second is a margin for a slower join, well inside the 8 s a placement waits."""


class ProbeReply(FrozenModel):
    node_id: NodeId
    # Empty on the round-trip probe; BULK_PAYLOAD_BYTES of random text on the bulk probe.
    padding: str = ""


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
        # When each peer's bandwidth was last timed (time.monotonic()).
        self._bandwidth_timed: dict[NodeId, float] = {}
        # The settling rounds still due for each peer that joined a moment ago (time.monotonic()).
        self._settle_at: dict[NodeId, list[float]] = {}
        self._seen: set[NodeId] = set()
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
        self._bus.answer_queries_with(self._topics.link_probe(me), ProbeReply(node_id=me))
        bulk = ProbeReply(node_id=me, padding=secrets.token_hex(BULK_PAYLOAD_BYTES // 2))
        self._bus.answer_queries_with(self._topics.link_probe_bulk(me), bulk)
        while True:
            await self.measure_all()
            with anyio.move_on_after(self._until_next_round()):
                await self._joined.wait()
            self._joined = anyio.Event()

    async def measure_all(self) -> None:
        """Measure every live peer now; forget the ones that left."""
        peers = sorted(self._membership.view.live_nodes - {self._membership.node_id})
        for gone in set(self._links) - set(peers):
            del self._links[gone]
        for gone in set(self._bandwidth_timed) - set(peers):
            del self._bandwidth_timed[gone]
        for gone in self._seen - set(peers):  # one that comes back settles again
            self._seen.discard(gone)
            self._settle_at.pop(gone, None)
        now = time.monotonic()
        for joined in set(peers) - self._seen:
            self._seen.add(joined)
            self._settle_at[joined] = [now + delay for delay in SETTLE_ROUNDS_SECONDS]
        for peer in peers:
            settling = peer in self._settle_at
            measured = await self.measure(peer, bandwidth=settling or self._bandwidth_due(peer))
            if settling:
                measured = self._settling_round(peer, measured)
            if measured is not None:
                self._links[peer] = measured
            elif peer in self._links and peer in self._membership.view.live_nodes:
                logger.info("no probe reply from %s within %.1f s: its round trip is unknown", peer, self._timeout)
                del self._links[peer]
                self._bandwidth_timed.pop(peer, None)
        if peers and self._measured is not None:
            self._measured()

    async def measure(self, peer: NodeId, *, bandwidth: bool = True) -> LinkMeasurement | None:
        """The median of PROBE_SAMPLES round trips to `peer`, or None when it answered none of them; with its
        bandwidth timed anew when `bandwidth` says so (BANDWIDTH_SAMPLES bulk trips among the small ones), else (or
        where the new timing gave no figure) the last figure kept."""
        trips: list[float] = []
        bulk_trips: list[float] = []
        for sample in range(PROBE_SAMPLES):
            trip = await self._trip(self._topics.link_probe(peer), peer)
            if trip is not None:
                trips.append(trip)
            if bandwidth and sample < BANDWIDTH_SAMPLES:
                bulk = await self._trip(self._topics.link_probe_bulk(peer), peer)
                if bulk is None:  # a peer that does not answer it costs one timeout a round, not three
                    bandwidth = False
                else:
                    bulk_trips.append(bulk)
        logger.debug(
            "probe %s: small trips %s ms, bulk trips %s ms",
            peer,
            ", ".join(f"{trip * 1000:.3f}" for trip in trips),
            ", ".join(f"{trip * 1000:.3f}" for trip in bulk_trips),
        )
        if not trips:
            return None
        previous = self._links.get(peer)
        bytes_per_second = previous.bandwidth_bytes_per_second if previous is not None else None
        timed = bandwidth_from(trips, bulk_trips)
        if timed is not None:  # else timed again at the next round
            self._bandwidth_timed[peer] = time.monotonic()
            bytes_per_second = timed
        return LinkMeasurement(
            round_trip_ms=round(statistics.median(trips) * 1000, 3),
            samples=len(trips),
            measured_at=time.time(),
            bandwidth_bytes_per_second=bytes_per_second,
        )

    async def _trip(self, key: str, peer: NodeId) -> float | None:
        return await self._bus.round_trip(key, ProbeReplyAdapter, peer, self._timeout)

    def _settling_round(self, peer: NodeId, measured: LinkMeasurement | None) -> LinkMeasurement | None:
        """The figures of a settling round of `peer`: the best of `measured` and its earlier settling rounds' (a busy
        moment only adds time), `settling` while another such round is due."""
        self._settle_at[peer] = due = [at for at in self._settle_at[peer] if at > time.monotonic()]
        if not due:
            del self._settle_at[peer]
        if measured is None:
            return None
        previous = self._links.get(peer)
        if previous is None or not previous.settling:
            return measured.model_copy(update={"settling": bool(due)})
        bandwidths = [
            figure
            for figure in (previous.bandwidth_bytes_per_second, measured.bandwidth_bytes_per_second)
            if figure is not None
        ]
        return measured.model_copy(
            update={
                "settling": bool(due),
                "round_trip_ms": min(previous.round_trip_ms, measured.round_trip_ms),
                "bandwidth_bytes_per_second": max(bandwidths, default=None),
            }
        )

    def _until_next_round(self) -> float:
        """Seconds to the next round: PROBE_INTERVAL_SECONDS, or less where a settling round is due sooner."""
        due = [at for times in self._settle_at.values() for at in times]
        return max(0.0, min([PROBE_INTERVAL_SECONDS, *(at - time.monotonic() for at in due)]))

    def _bandwidth_due(self, peer: NodeId) -> bool:
        timed = self._bandwidth_timed.get(peer)
        return timed is None or time.monotonic() - timed >= BANDWIDTH_INTERVAL_SECONDS

    def _on_change(self, old: MembershipView, new: MembershipView) -> None:
        if new.live_nodes - old.live_nodes:
            self._joined.set()


def bandwidth_from(trips: list[float], bulk_trips: list[float]) -> float | None:
    """Bytes a second from small and bulk trips (seconds): the bulk reply's extra bytes over the fastest bulk trip's
    extra time against the fastest small one (a busy moment only adds time, so the fastest of each is the closest to
    the link's own cost). None without both, or where the bulk trip was not slower."""
    if not trips or not bulk_trips:
        return None
    extra_seconds = min(bulk_trips) - min(trips)
    return round(BULK_PAYLOAD_BYTES / extra_seconds) if extra_seconds > 0 else None
