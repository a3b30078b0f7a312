"""A node of a split model killed mid-stream: the request ends with one error, the instance is torn down on the
survivors (no rank left running), and the model is placed again over the nodes that remain; the next request works.

Three real nodes on 127.0.0.1: alpha holds an endless copy of tiny-qwen-tools-deep (it generates until max_tokens)
and asks for it over two nodes; beta and gamma hold nothing. The instance takes two of the three; a rank's node
other than alpha (which holds the files and asks for the placement) is killed while rank 0 streams.
"""

import json
from collections.abc import Iterator

import httpx
import psutil
import pytest

from exo.shared.types.cluster_api import PlacedInstanceView
from tests.cluster.local_cluster import ClusterNode, LocalCluster, crash_mid_stream, local_cluster
from tests.fixtures.endless_model import MODEL, endless_copy
from tests.fixtures.fixture_specs import user

PLACED_WITHIN_S = 240.0
ERROR_WITHIN_S = 10.0


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    endless = endless_copy(tmp_path_factory.mktemp("models"), source="tiny-qwen-tools-deep")
    with local_cluster(tmp_path_factory.mktemp("pipeline-failover"), "pipe-failover") as running:
        alpha, _beta = running.launch_split(endless)
        running.launch("gamma", peers=[alpha])
        yield running


def _ready_instance(node: ClusterNode, excluded: str | None = None) -> PlacedInstanceView | None:
    instances = node.instances().data
    if len(instances) != 1 or not instances[0].ready:
        return None
    if excluded is not None and any(rank.node_id == excluded for rank in instances[0].ranks):
        return None
    return instances[0]


def _rank_processes(node: ClusterNode) -> list[int]:
    """The runner processes the node lists in its state."""
    return [runner["pid"] for runner in node.state()["runners"].values() if runner["node_id"] == node.node_id]


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_killed_rank_node_fails_the_stream_once_and_the_model_is_placed_on_the_survivors(
    cluster: LocalCluster,
) -> None:
    alpha = cluster.nodes[0]
    cluster.wait_until(alpha, lambda: _ready_instance(alpha) is not None, "the model placed", PLACED_WITHIN_S)
    first = _ready_instance(alpha)
    assert first is not None
    victim = next(node for node in cluster.nodes[1:] if any(rank.node_id == node.node_id for rank in first.ranks))
    survivors = [node for node in cluster.nodes if node is not victim]
    old_ranks = [pid for node in survivors for pid in _rank_processes(node)]
    assert old_ranks
    body = {"model": MODEL, "messages": [user("Hello!")], "max_tokens": 3000, "stream": True}
    events, ended_after = crash_mid_stream(cluster, alpha, victim, body)
    assert events[-1] == "[DONE]"
    errors = [json.loads(event)["error"] for event in events[:-1] if '"error"' in event]
    assert len(errors) == 1, events[-5:]
    assert ended_after < ERROR_WITHIN_S
    # Placed again over the two nodes that remain, and serving.
    cluster.wait_until(
        alpha,
        lambda: _ready_instance(alpha, excluded=victim.node_id) is not None,
        "the model placed on the survivors",
        PLACED_WITHIN_S,
    )
    second = _ready_instance(alpha, excluded=victim.node_id)
    assert second is not None
    assert second.instance_id != first.instance_id
    assert {rank.node_id for rank in second.ranks} == {node.node_id for node in survivors}
    answer = httpx.post(
        f"{alpha.base_url}/v1/chat/completions", json={**body, "stream": False, "max_tokens": 8}, timeout=120
    )
    assert answer.status_code == 200
    assert answer.json()["usage"]["completion_tokens"] == 8
    # Every runner a survivor still lists is a rank of the new instance; the old ranks' processes are gone.
    state = cluster.settled_states(survivors)
    assert {runner["instance_id"] for runner in state["runners"].values()} == {second.instance_id}
    for node in survivors:
        assert len(_rank_processes(node)) == 1
    assert not [pid for pid in old_ranks if _running(pid)]
