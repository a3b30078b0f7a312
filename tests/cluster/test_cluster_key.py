"""A keyed cluster (`--cluster-key`): real nodes on 127.0.0.1 with the key link (mutual TLS) and serve; a node with
a wrong key or none cannot join, and a zenoh session dialling its port neither joins nor reads its traffic without
the key: in plain TCP, in TLS with another key's certificates, or in TLS trusting the cluster's authority but with
no certificate of its own.

A session with the key's certificates, linked the same way, does read that traffic: the check could fail.
That the links are encrypted on the wire is checked on the rig (test_cluster_rig_tls.py).
"""

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import zenoh

from exo.cluster.cluster_tls import tls_link_config
from exo.cluster.settings import ClusterSettings, apply_cluster_key, link_endpoint
from exo.cluster.topics import Topics
from tests.cluster.local_cluster import ClusterNode, LocalCluster, local_cluster
from tests.exo_server import fixture_model
from tests.fixtures.fixture_specs import user

MODEL = "tiny-qwen-tools"
CLUSTER = "keyed"
KEY = "a key for the keyed-cluster test"
CHAT: dict[str, Any] = {"model": MODEL, "messages": [user("Hello!")], "max_tokens": 4}


def _keyed(key: str) -> list[str]:
    return ["--cluster-key", key]


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, ClusterNode, ClusterNode]]:
    with local_cluster(tmp_path_factory.mktemp("keyed"), CLUSTER) as running:
        alpha = running.launch("alpha", [fixture_model(MODEL)], extra_arguments=_keyed(KEY))
        running.wait_ready(alpha)
        beta = running.launch("beta", peers=[alpha], extra_arguments=_keyed(KEY))
        for node in (alpha, beta):
            running.wait_until(node, lambda node=node: _healthy(node) == 2, "both keyed nodes joined", 60)
        yield running, alpha, beta


def _healthy(node: ClusterNode) -> int:
    healthy: int = node.get("/v1/cluster")["nodes_healthy"]
    return healthy


def _session(alpha: ClusterNode, tls: str) -> zenoh.Session:
    """A bare zenoh session linked to alpha: `plain` TCP, `wrong-key` TLS, `authority-only` TLS (it trusts the
    cluster's authority but presents no certificate), or with the `right-key`."""
    config = zenoh.Config()
    config.insert_json5("mode", '"peer"')
    config.insert_json5("listen/endpoints", "[]")
    config.insert_json5("scouting/multicast/enabled", "false")
    keyed = ClusterSettings(name=CLUSTER, key=KEY)
    endpoint = link_endpoint(alpha.endpoint, keyed)
    if tls == "plain":
        endpoint = alpha.endpoint
    elif tls == "wrong-key":
        apply_cluster_key(config, ClusterSettings(name=CLUSTER, key="a different key, 16+ chars"))
    elif tls == "authority-only":
        authority = tls_link_config(KEY, CLUSTER).root_ca_certificate_base64
        config.insert_json5("transport/link/tls", json.dumps({"root_ca_certificate_base64": authority}))
    else:
        apply_cluster_key(config, keyed)
    config.insert_json5("connect/endpoints", json.dumps([endpoint]))
    return zenoh.open(config)


def _heard_while_serving(alpha: ClusterNode, beta: ClusterNode, tls: str) -> list[str]:
    """The keys a session (see `_session`) receives under the cluster's root while beta forwards a request."""
    heard: list[str] = []
    session = _session(alpha, tls)
    try:
        subscriber = session.declare_subscriber(
            f"{Topics(CLUSTER).root}/**", lambda sample: heard.append(str(sample.key_expr))
        )
        time.sleep(1.0)
        answer = httpx.post(f"{beta.base_url}/v1/chat/completions", json=CHAT, timeout=60)
        assert answer.status_code == 200, answer.text
        time.sleep(1.0)
        del subscriber
    finally:
        session.close()
    return heard


def test_nodes_with_the_key_form_the_cluster_and_serve(keyed: tuple[LocalCluster, ClusterNode, ClusterNode]) -> None:
    _, alpha, beta = keyed
    answer = httpx.post(f"{beta.base_url}/v1/chat/completions", json=CHAT, timeout=60)
    assert answer.status_code == 200, answer.text
    assert "unauthenticated" not in alpha.log()  # the open-port warning is for clusters without a key


@pytest.mark.parametrize("key", ["a different key, 16+ chars", None])
def test_a_node_with_a_wrong_key_or_none_cannot_join(
    keyed: tuple[LocalCluster, ClusterNode, ClusterNode], key: str | None
) -> None:
    cluster, alpha, beta = keyed
    name = "wrong-key" if key else "no-key"
    intruder = cluster.launch(name, peers=[alpha], extra_arguments=_keyed(key) if key else ())
    cluster.wait_until(intruder, lambda: _healthy(intruder) == 1, "the intruder's own API", 60)
    time.sleep(3.0)  # time enough to join, were it let in
    assert _healthy(intruder) == 1
    assert intruder.get("/v1/models")["data"] == []
    for node in (alpha, beta):
        assert _healthy(node) == 2
        assert intruder.node_id not in {member["node_id"] for member in node.get("/v1/cluster/nodes")["data"]}
    cluster.stop(intruder)


def test_a_session_without_the_key_reads_nothing_and_one_with_it_reads_the_traffic(
    keyed: tuple[LocalCluster, ClusterNode, ClusterNode],
) -> None:
    _, alpha, beta = keyed
    for outsider in ("plain", "wrong-key", "authority-only"):
        assert _heard_while_serving(alpha, beta, outsider) == [], outsider
    heard = _heard_while_serving(alpha, beta, "right-key")
    assert f"{Topics(CLUSTER).root}/events/ordered" in heard


def test_keyed_nodes_measure_the_round_trip_between_them_over_the_key_link(
    keyed: tuple[LocalCluster, ClusterNode, ClusterNode],
) -> None:
    """The link probe (cluster/link_probe.py) is a zenoh query like any other: it works over the TLS link."""
    cluster, alpha, beta = keyed

    def links(state: dict[str, Any]) -> dict[str, float]:
        return {
            node: link["round_trip_ms"]
            for node, peer in ((alpha.node_id, beta.node_id), (beta.node_id, alpha.node_id))
            if (link := state["nodes"][node]["facts"]["links"].get(peer)) is not None
        }

    cluster.wait_until(alpha, lambda: len(links(alpha.state())) == 2, "both keyed nodes' round trips", 60)
    assert all(0 < trip < 2000 for trip in links(alpha.state()).values())
