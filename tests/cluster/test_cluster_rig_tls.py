"""A keyed cluster on the rig (tests/cluster/netns_rig.py): its links are TLS on the wire, and nodes without the key
stay out even where multicast shows them the cluster.

alpha (keyed) serves tiny-qwen-tools on the bridge. beta (keyed) has no link of its own: it reaches alpha only
through the rig's proxy, which here adds nothing but keeps every byte it carries — a wiretap on the link. gamma (no
key) and delta (another key) sit on the bridge with discovery on, and gamma names alpha as its peer as well.
"""

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster.lossy_proxy import LossyProxy
from tests.cluster.netns_rig import CLUSTER_PORT, NetnsRig, RigNode
from tests.exo_server import fixture_model
from tests.fixtures.fixture_specs import user
from tests.machine_skips import machine_skipif

MODEL = "tiny-qwen-tools"
KEY = "the rig's cluster key, long enough"
CLUSTER = "tls"
PROXY_PORT = 52500
# Said in a prompt and expected nowhere on the wire.
MARKER = "zebra-quartz-marmalade"
TLS_RECORD_TYPES = {20, 21, 22, 23}  # change_cipher_spec, alert, handshake, application_data
APPLICATION_DATA = 23
MAX_RECORD_BYTES = 2**14 + 256
JOIN_WINDOW_S = 25.0

_WHY_NOT = NetnsRig.unavailable()
pytestmark = machine_skipif(_WHY_NOT)


@pytest.fixture(scope="module")
def keyed_rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NetnsRig, LossyProxy, float]]:
    rig = NetnsRig(tmp_path_factory.mktemp("tls"), CLUSTER)
    proxy: LossyProxy | None = None
    try:
        rig.create()
        alpha = rig.add_node("alpha", [fixture_model(MODEL)])
        beta = rig.add_node("beta", isolated=True)
        gamma = rig.add_node("gamma")
        delta = rig.add_node("delta")
        proxy = LossyProxy(
            listen_namespace=beta.namespace,
            listen_port=PROXY_PORT,
            target_namespace=rig.bridge_namespace,
            target=(alpha.address, CLUSTER_PORT),
            delay_s=0.0,
            loss=0.0,
            record=True,
        )
        proxy.start()
        started = time.monotonic()
        rig.start(alpha, ["--cluster-key", KEY])
        rig.start(beta, ["--cluster-key", KEY, "--no-discovery", "--peer", f"tcp/127.0.0.1:{PROXY_PORT}"])
        rig.start(gamma, ["--peer", alpha.endpoint])
        rig.start(delta, ["--cluster-key", "another key, also long enough"])
        for node in (alpha, beta):
            rig.wait_until(lambda node=node: _healthy(rig, node) == 2, "the keyed nodes joined", 180)
        rig.wait_until(lambda: _chat(rig, beta, "Hello!").status_code == 200, "the model served through beta", 120)
        yield rig, proxy, started
    finally:
        if proxy is not None:
            proxy.close()
        rig.close()


def _healthy(rig: NetnsRig, node: RigNode) -> int:
    healthy: int = rig.get(node, "/v1/cluster", timeout=5)["nodes_healthy"]
    return healthy


def _chat(rig: NetnsRig, node: RigNode, text: str) -> Any:
    body = {"model": MODEL, "messages": [user(text)], "max_tokens": 8}
    return rig.post(node, "/v1/chat/completions", body)


def tls_records(stream: bytes) -> list[int]:
    """The content type of each TLS record `stream` is made of; fails on anything that is not a TLS record (a
    last record the capture cut short is allowed)."""
    types: list[int] = []
    offset = 0
    while offset + 5 <= len(stream):
        content_type, major, length = (
            stream[offset],
            stream[offset + 1],
            int.from_bytes(stream[offset + 3 : offset + 5]),
        )
        where = f"not a TLS record at byte {offset}: {stream[offset : offset + 16]!r}"
        assert content_type in TLS_RECORD_TYPES, where
        assert major == 3, where
        assert length <= MAX_RECORD_BYTES, where
        types.append(content_type)
        offset += 5 + length
    return types


def test_the_link_carries_only_tls_records_and_no_prompt_in_clear(
    keyed_rig: tuple[NetnsRig, LossyProxy, float],
) -> None:
    rig, proxy, _ = keyed_rig
    beta = rig.nodes[1]
    answer = _chat(rig, beta, f"Repeat after me: {MARKER} {MARKER}")
    assert answer.status_code == 200, answer.text  # served by alpha, so the prompt crossed the link
    recordings = [bytes(recording) for recording in proxy.recordings if recording]
    assert len(recordings) >= 2  # both directions of beta's link
    for stream in recordings:
        records = tls_records(stream)
        assert records[0] == 22  # every stream opens with a TLS handshake
        assert MARKER.encode() not in stream
        assert MODEL.encode() not in stream
    assert sum(tls_records(stream).count(APPLICATION_DATA) for stream in recordings) > 10


def test_nodes_without_the_key_stay_out(keyed_rig: tuple[NetnsRig, LossyProxy, float]) -> None:
    rig, _, rig_started = keyed_rig
    alpha, beta, gamma, delta = rig.nodes
    for outsider in (gamma, delta):
        rig.wait_until(lambda outsider=outsider: _healthy(rig, outsider) >= 1, "the outsider's own API", 120)
    # Time to be found by multicast and linked, were they let in (the open rig's three nodes met in 14 s).
    time.sleep(max(0.0, JOIN_WINDOW_S - (time.monotonic() - rig_started)))
    for outsider in (gamma, delta):
        assert _healthy(rig, outsider) == 1  # up, alone: multicast showed it the cluster, the link was refused
        assert rig.get(outsider, "/v1/models")["data"] == []
        assert _chat(rig, outsider, "Hello!").status_code != 200
    members = {member["node_id"] for member in rig.get(alpha, "/v1/cluster/nodes")["data"]}
    assert members == {alpha.node_id, beta.node_id}
    assert _healthy(rig, alpha) == 2
