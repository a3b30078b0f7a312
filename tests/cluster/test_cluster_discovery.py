"""How nodes find each other: explicit peers, peers added at runtime, multicast scouting, and cluster names that
keep two clusters apart even when their nodes are connected. Every node here serves no model (fast to start)."""

import json
import time
from collections.abc import Iterator
from uuid import uuid4

import httpx
import pytest
import zenoh

from exo.cluster.settings import loopback_interface
from exo.shared.types.cluster_api import DiscoveryReport, PeerConnection
from tests.cluster.local_cluster import ClusterNode, LocalCluster, local_cluster
from tests.exo_server import free_port
from tests.machine_skips import skip_for_machine


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_cluster(tmp_path_factory.mktemp("discovery"), f"apart-{uuid4().hex[:8]}") as running:
        yield running


def node_ids(member: ClusterNode) -> set[str]:
    return set(member.state()["nodes"])


def add_peer(member: ClusterNode, endpoint: str) -> httpx.Response:
    return httpx.post(f"{member.base_url}/v1/cluster/peers", json={"endpoint": endpoint}, timeout=60)


def test_two_cluster_names_stay_apart_even_when_their_nodes_are_connected(cluster: LocalCluster) -> None:
    x = cluster.start("x")
    y = cluster.start("y", peers=[x], cluster_name=f"{cluster.cluster_name}-other")
    # y dials x and the link is up (x answers), yet neither joins the other's cluster.
    connection = PeerConnection.model_validate(add_peer(y, x.endpoint).json())
    assert (connection.node_id, connection.joined) == (x.node_id, False)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        assert node_ids(x) == {x.node_id}
        assert node_ids(y) == {y.node_id}
        time.sleep(0.25)
    assert [card["id"] for card in y.get("/v1/models")["data"]] == []


def test_a_peer_added_at_runtime_joins(cluster: LocalCluster) -> None:
    x = next(member for member in cluster.nodes if member.name == "x")
    z = cluster.start("z")
    assert node_ids(z) == {z.node_id}
    response = add_peer(z, x.endpoint.removeprefix("tcp/"))  # a bare HOST:PORT is fine too
    assert response.status_code == 200, response.text
    assert PeerConnection.model_validate(response.json()) == PeerConnection(
        endpoint=x.endpoint, node_id=x.node_id, joined=True
    )
    state = cluster.settled_states([x, z])
    assert set(state["nodes"]) == {x.node_id, z.node_id}
    assert state["master_node_id"] == x.node_id


def test_an_unreachable_peer_or_this_node_is_a_502_and_a_malformed_one_a_400(cluster: LocalCluster) -> None:
    x = next(member for member in cluster.nodes if member.name == "x")
    started = time.monotonic()
    silent = f"tcp/127.0.0.1:{free_port()}"
    response = add_peer(x, silent)
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "peer_unreachable"
    assert response.json()["error"]["message"] == f"nothing answered at {silent}"
    assert time.monotonic() - started < 30
    response = add_peer(x, x.endpoint)
    assert response.status_code == 502
    assert response.json()["error"]["message"] == f"{x.endpoint} is this node itself"
    response = add_peer(x, "not an endpoint")
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "endpoint"


def loopback_multicast_works() -> bool:
    """Whether two zenoh sessions find each other by multicast scouting on this machine's loopback interface."""
    interface = loopback_interface()
    if interface is None:
        return False
    group = f"224.0.0.224:{free_port()}"
    sessions: list[zenoh.Session] = []
    try:
        for _ in range(2):
            config = zenoh.Config()
            config.insert_json5("mode", '"peer"')
            config.insert_json5("listen/endpoints", json.dumps([f"tcp/127.0.0.1:{free_port()}"]))
            config.insert_json5("scouting/multicast/enabled", "true")
            config.insert_json5("scouting/multicast/address", json.dumps(group))
            config.insert_json5("scouting/multicast/interface", json.dumps(interface))
            sessions.append(zenoh.open(config))
        # Scouting answers within a second on a quiet machine; a loaded one must not read "no multicast" here, since
        # under EXO_STRICT_SKIPS=1 that fails the tests.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if sessions[0].info.peers_zid():
                return True
            time.sleep(0.1)
        return False
    except zenoh.ZError:
        return False
    finally:
        for session in sessions:
            session.close()


@pytest.fixture(scope="module")
def multicast() -> None:
    if not loopback_multicast_works():
        skip_for_machine("multicast scouting does not work on this machine's loopback interface (explicit peers do)")


@pytest.mark.usefixtures("multicast")
def test_nodes_with_discovery_find_each_other_without_peers(cluster: LocalCluster) -> None:
    name = f"scout-{uuid4().hex[:8]}"
    first = cluster.start("s1", cluster_name=name, discovery=True)
    second = cluster.start("s2", cluster_name=name, discovery=True)
    state = cluster.settled_states([first, second])
    assert set(state["nodes"]) == {first.node_id, second.node_id}


@pytest.mark.usefixtures("multicast")
def test_a_node_without_discovery_scans_on_request(cluster: LocalCluster) -> None:
    scouts = [member for member in cluster.nodes if member.name in ("s1", "s2")]
    if len(scouts) != 2:
        pytest.skip("needs the two scouting nodes of the previous test")
    name = scouts[0].get("/v1/cluster")["cluster"]
    loner = cluster.start("d", cluster_name=name)
    assert node_ids(loner) == {loner.node_id}
    response = httpx.post(f"{loner.base_url}/v1/cluster/discover", timeout=60)
    assert response.status_code == 200, response.text
    found = {peer.node_id: peer for peer in DiscoveryReport.model_validate(response.json()).found}
    for scout in scouts:
        assert found[scout.node_id].joined
        assert any(endpoint.startswith("tcp/127.0.0.1:") for endpoint in found[scout.node_id].endpoints)
    state = cluster.settled_states([*scouts, loner])
    assert set(state["nodes"]) == {loner.node_id, *(scout.node_id for scout in scouts)}
