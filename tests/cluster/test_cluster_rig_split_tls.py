"""A split model in a keyed cluster on the rig: every connection between its nodes is TLS from the first byte, the
ranks' own sockets (mlx's ring, exo's task connections) included, and its prompts cross the wire in no clear text —
for a split by layers (pipeline) and one by matrices (tensor, whose ring carries two all-sums per layer per token).

alpha holds tiny-qwen-tools-deep (`--min-nodes 2`), beta nothing; their only link is the rig's userspace switch
(tun_link.py), which here adds no delay but keeps a copy of every packet — a wiretap under the ranks' sockets, which
are dialled at addresses drawn at placement, where no proxy can stand. The same run without the key finds the
prompt's marker in clear on the wire: the check could fail.
"""

import time
from collections.abc import Iterator
from typing import Any

import pytest

from exo.shared.types.cluster_api import InstanceList
from tests.cluster.netns_rig import NetnsRig, RigNode
from tests.cluster.test_cluster_rig_tls import APPLICATION_DATA, tls_records
from tests.cluster.tun_link import TunLink
from tests.exo_server import fixture_model
from tests.fixtures.fixture_specs import user
from tests.machine_skips import machine_skipif

MODEL = "tiny-qwen-tools-deep"
KEY = "the rig's cluster key for a split model"
ADDRESSES = ("10.79.0.1", "10.79.0.2")
MARKER = "walrus-tangerine-obelisk"
PLACED_WITHIN_S = 240.0
TCP = 6

_WHY_NOT = NetnsRig.unavailable()
pytestmark = machine_skipif(_WHY_NOT)


def _ready_split(rig: NetnsRig, node: RigNode, parallel: str) -> bool:
    instances = InstanceList.model_validate(rig.get(node, "/v1/cluster/instances", timeout=5)).data
    if len(instances) != 1:
        return False
    return instances[0].ready and (instances[0].world_size, instances[0].parallel) == (2, parallel)


def _chat(rig: NetnsRig, node: RigNode, text: str) -> Any:
    body = {"model": MODEL, "messages": [user(text)], "max_tokens": 8}
    return rig.post(node, "/v1/chat/completions", body)


def tcp_streams(packets: list[bytes]) -> dict[tuple[bytes, int, bytes, int], bytes]:
    """Each TCP connection's bytes in one direction, keyed by (source, port, destination, port), put together in
    sequence order from the captured IPv4 packets (a retransmitted segment counted once)."""
    segments: dict[tuple[bytes, int, bytes, int], dict[int, bytes]] = {}
    for packet in packets:
        if len(packet) < 20 or packet[0] >> 4 != 4 or packet[9] != TCP:
            continue
        ip_header = (packet[0] & 0x0F) * 4
        tcp = packet[ip_header:]
        payload = tcp[(tcp[12] >> 4) * 4 :]
        if not payload:
            continue
        flow = (packet[12:16], int.from_bytes(tcp[0:2]), packet[16:20], int.from_bytes(tcp[2:4]))
        segments.setdefault(flow, {}).setdefault(int.from_bytes(tcp[4:8]), payload)
    return {flow: b"".join(pieces[sequence] for sequence in sorted(pieces)) for flow, pieces in segments.items()}


def _split_rig(work_dir: Any, key: str | None, parallel: str) -> Iterator[tuple[NetnsRig, TunLink]]:
    rig = NetnsRig(work_dir, "split-tls")
    link: TunLink | None = None
    keyed = ["--cluster-key", key] if key else []
    try:
        rig.create()
        alpha = rig.add_node("alpha", [fixture_model(MODEL)], isolated=True)
        beta = rig.add_node("beta", isolated=True)
        alpha.link_address, beta.link_address = ADDRESSES
        link = TunLink([(alpha.namespace, alpha.address), (beta.namespace, beta.address)], record=True)
        link.start()
        rig.start(alpha, ["--min-nodes", "2", "--parallel", parallel, "--no-discovery", *keyed])
        rig.start(beta, ["--no-discovery", "--peer", alpha.endpoint, *keyed])
        rig.wait_until(lambda: _ready_split(rig, alpha, parallel), f"the {parallel} split", PLACED_WITHIN_S)
        yield rig, link
    finally:
        if link is not None:
            link.close()
        rig.close()


@pytest.fixture(scope="module", params=["pipeline", "tensor"])
def keyed_split(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[tuple[NetnsRig, TunLink]]:
    parallel: str = request.param
    yield from _split_rig(tmp_path_factory.mktemp(f"split-tls-{parallel}"), KEY, parallel)


@pytest.fixture(scope="module")
def open_split(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NetnsRig, TunLink]]:
    yield from _split_rig(tmp_path_factory.mktemp("split-open"), None, "pipeline")


def _ask_both(rig: NetnsRig) -> None:
    """One request on each node: whichever holds rank 0, the prompt crosses the ranks' task connection."""
    for node in rig.nodes:
        answer = _chat(rig, node, f"Repeat after me: {MARKER} {MARKER}")
        assert answer.status_code == 200, answer.text
    time.sleep(0.5)  # the last packets through the switch


def test_every_connection_of_a_keyed_split_is_tls_from_its_first_byte(
    keyed_split: tuple[NetnsRig, TunLink],
) -> None:
    rig, link = keyed_split
    _ask_both(rig)
    streams = tcp_streams(link.recorded)
    # zenoh's links, and for the ranks at least the ring both ways and the task connection.
    assert len(streams) >= 6, sorted((flow[1], flow[3]) for flow in streams)
    for flow, stream in streams.items():
        records = tls_records(stream)
        assert records[0] == 22, flow  # every connection opens with a TLS handshake, whichever port it is on
        assert MARKER.encode() not in stream, flow
        assert MODEL.encode() not in stream, flow
    assert sum(tls_records(stream).count(APPLICATION_DATA) for stream in streams.values()) > 50


def test_without_the_key_the_prompt_crosses_the_ranks_sockets_in_clear(open_split: tuple[NetnsRig, TunLink]) -> None:
    rig, link = open_split
    _ask_both(rig)
    clear = [flow for flow, stream in tcp_streams(link.recorded).items() if MARKER.encode() in stream]
    assert clear, "the marker should be on the wire in clear without the key"
