"""The link probe (cluster/link_probe.py) over real zenoh sessions on 127.0.0.1: a node times the round trip to a
peer that answers its probe; a reply from another session on the peer's key does not count; a peer that does not
answer has no figure."""

import itertools
import time

import anyio
import pytest

from exo.cluster import link_probe
from exo.cluster.bus import Bus
from exo.cluster.link_probe import (
    BULK_PAYLOAD_BYTES,
    PROBE_INTERVAL_SECONDS,
    PROBE_SAMPLES,
    LinkProber,
    ProbeReply,
    bandwidth_from,
)
from exo.cluster.membership import Membership
from exo.cluster.topics import Member, Topics
from exo.shared.types.common import NodeId
from exo.shared.types.links import LinkMeasurement
from tests.cluster.buses import eventually, linked_buses

TOPICS = Topics("probe-test")
# Short, so that the tries a silent peer leaves unanswered end quickly.
TIMEOUT_S = 0.3


def node_id(bus: Bus) -> NodeId:
    """exo's zenoh id is its node id."""
    return NodeId(str(bus.session.zid()))


def prober(bus: Bus) -> LinkProber:
    me = Member(node_id=node_id(bus), started_at_ms=int(time.time() * 1000))
    return LinkProber(bus, TOPICS, Membership(bus, TOPICS, me), timeout_seconds=TIMEOUT_S)


async def test_a_node_times_the_round_trip_to_a_peer_that_answers_its_probe() -> None:
    measured: LinkMeasurement | None = None
    async with linked_buses(2) as (alpha, beta), anyio.create_task_group() as group:
        group.start_soon(prober(beta).run)  # beta answers (and measures nobody: it sees no members)
        with anyio.fail_after(20):
            while measured is None:  # until the link is up and beta's probe is declared
                measured = await prober(alpha).measure(node_id(beta))
        group.cancel_scope.cancel()
    assert measured is not None
    assert measured.samples >= 1
    assert measured.samples <= PROBE_SAMPLES
    # Two sessions in one process on loopback: more than nothing, less than the time allowed for a reply.
    assert 0 < measured.round_trip_ms < TIMEOUT_S * 1000
    assert abs(measured.measured_at - time.time()) < 60


async def test_a_reply_from_another_session_on_the_peers_key_does_not_count() -> None:
    async with linked_buses(3) as (alpha, beta, forger):
        # The forger answers on beta's probe key, naming beta; beta itself is silent.
        forger.answer_queries(TOPICS.link_probe(node_id(beta)), lambda: ProbeReply(node_id=node_id(beta)))
        await anyio.sleep(1.0)  # the forger's queryable reaches alpha
        assert await prober(alpha).measure(node_id(beta)) is None
        # The forger's replies arrive: the probe reaches it under its own key.
        forger.answer_queries(TOPICS.link_probe(node_id(forger)), lambda: ProbeReply(node_id=node_id(forger)))
        with anyio.fail_after(20):
            while await prober(alpha).measure(node_id(forger)) is None:
                pass


async def test_a_node_measures_the_bandwidth_from_a_peer_over_a_large_probe_reply() -> None:
    measured: LinkMeasurement | None = None
    async with linked_buses(2) as (alpha, beta), anyio.create_task_group() as group:
        group.start_soon(prober(beta).run)
        with anyio.fail_after(30):
            while measured is None or measured.bandwidth_bytes_per_second is None:
                measured = await prober(alpha).measure(node_id(beta))
        group.cancel_scope.cancel()
    assert measured is not None
    assert measured.bandwidth_bytes_per_second is not None
    # Loopback between two sessions of one process: 256 KiB more took less than the time allowed for a reply.
    assert measured.bandwidth_bytes_per_second > BULK_PAYLOAD_BYTES / TIMEOUT_S
    print(f"loopback: {measured.round_trip_ms} ms, {measured.bandwidth_bytes_per_second / 1e6:.0f} MB/s")


def test_the_bandwidth_is_the_extra_bytes_over_the_fastest_bulk_trips_extra_time() -> None:
    # Small trips at best 1 ms, bulk trips at best 5 ms (a busy moment made one 30 ms): 256 KiB in 4 ms.
    assert bandwidth_from([0.002, 0.001, 0.004], [0.005, 0.030, 0.006]) == round(BULK_PAYLOAD_BYTES / 0.004)
    # No bulk reply, or a bulk trip no slower than the small one: no figure.
    assert bandwidth_from([0.001], []) is None
    assert bandwidth_from([0.005, 0.004], [0.004, 0.009]) is None


async def test_a_peer_that_answers_only_the_small_probe_has_a_round_trip_and_no_bandwidth() -> None:
    measured: LinkMeasurement | None = None
    async with linked_buses(2) as (alpha, beta):
        # beta answers its round-trip probe (as a node from before bandwidth was measured would), not the bulk one.
        beta.answer_queries_with(TOPICS.link_probe(node_id(beta)), ProbeReply(node_id=node_id(beta)))
        took = 0.0
        with anyio.fail_after(20):
            while measured is None:
                started = time.monotonic()
                measured = await prober(alpha).measure(node_id(beta))
                took = time.monotonic() - started
    assert measured.round_trip_ms > 0
    assert measured.bandwidth_bytes_per_second is None
    # Unanswered bulk queries do not hold the round trip up by a timeout each (zenoh ends a query no queryable
    # matches at once; a first one that times out ends the timing).
    assert took < 2.5 * TIMEOUT_S, took


async def test_a_peer_that_joins_is_measured_again_within_seconds_and_its_figures_settle_on_the_best(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Shorter settling rounds than a node's, so that the test takes a second.
    monkeypatch.setattr(link_probe, "SETTLE_ROUNDS_SECONDS", (0.3, 0.8))
    published: list[LinkMeasurement] = []
    async with linked_buses(2) as (alpha, beta), anyio.create_task_group() as group:
        members = [
            Membership(bus, TOPICS, Member(node_id=node_id(bus), started_at_ms=int(time.time() * 1000)))
            for bus in (alpha, beta)
        ]
        probers = [LinkProber(bus, TOPICS, membership) for bus, membership in zip((alpha, beta), members, strict=True)]
        peer = node_id(beta)

        def report() -> None:
            if (link := probers[0].measurements().get(peer)) is not None:
                published.append(link)

        probers[0].after_measuring(report)
        for part in (*members, *probers):
            group.start_soon(part.run)
        await eventually(lambda: any(not link.settling for link in published))
        group.cancel_scope.cancel()
    settling = [link for link in published if link.settling]
    settled = next(link for link in published if not link.settling)
    # The round that saw beta join and the settling round 0.3 s after it, each published as settling; the last
    # settling round, 0.8 s after the first began, publishes the settled figure (the regular rounds come 15 s apart).
    assert len(settling) >= 2
    assert settled.measured_at - settling[0].measured_at >= 0.5
    assert settled.measured_at - settling[0].measured_at < PROBE_INTERVAL_SECONDS
    # Each settling round keeps the best so far: the least round trip, the most bandwidth (timed in every round).
    rounds = [*settling, settled]
    for earlier, later in itertools.pairwise(rounds):
        assert later.round_trip_ms <= earlier.round_trip_ms
        if earlier.bandwidth_bytes_per_second is not None:
            assert later.bandwidth_bytes_per_second is not None
            assert later.bandwidth_bytes_per_second >= earlier.bandwidth_bytes_per_second
    assert settled.bandwidth_bytes_per_second is not None
