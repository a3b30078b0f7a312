"""Readable node names, with two real nodes on 127.0.0.1 that report the same name (two machines both called "vm"):
the cluster shows each as the name plus a short id of its node, in /state, /v1/cluster/nodes and the cluster's
summary; a node with a name of its own (`--node-name`) is shown by that name alone."""

from collections.abc import Iterator

import pytest

from exo.shared.types.cluster_api import ClusterNodeList
from tests.cluster.local_cluster import LocalCluster, local_cluster
from tests.exo_server import fixture_model

MODEL = "tiny-qwen-tools"


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_cluster(tmp_path_factory.mktemp("names"), "names") as running:
        yield running


def test_nodes_with_one_name_are_shown_apart_and_a_chosen_name_as_it_is(cluster: LocalCluster) -> None:
    first = cluster.start("first", [fixture_model(MODEL)])
    # The harness names every node; the last --node-name wins, as for any option given twice.
    second = cluster.launch("second", peers=[first], extra_arguments=["--node-name", "first"])
    cluster.wait_ready(second)
    expected = {first.node_id: f"first-{first.node_id[:6]}", second.node_id: f"first-{second.node_id[:6]}"}

    def shown() -> dict[str, str]:
        listed = ClusterNodeList.model_validate(first.get("/v1/cluster/nodes")).data
        return {node.node_id: node.display_name for node in listed}

    cluster.wait_until(first, lambda: shown() == expected, "both names told apart", 60)
    state = cluster.settled_states([first, second])
    assert {node_id: node["display_name"] for node_id, node in state["nodes"].items()} == expected
    assert {node["facts"]["name"] for node in state["nodes"].values()} == {"first"}
    (model,) = first.get("/v1/cluster")["models"]
    assert [instance["node_name"] for instance in model["instances"]] == [expected[first.node_id]]

    cluster.stop(second)
    renamed = cluster.launch("second", home=second.home, peers=[first], extra_arguments=["--node-name", "studio"])
    cluster.wait_ready(renamed)
    apart = {first.node_id: "first", renamed.node_id: "studio"}
    cluster.wait_until(first, lambda: shown() == apart, "the chosen names alone", 60)
