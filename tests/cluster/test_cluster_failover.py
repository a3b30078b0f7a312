"""Nodes crash, freeze, restart and take the master with them; the rest of the cluster notices and keeps serving.

m1 serves tiny-qwen-tools and is master (it starts first), m2 serves endless-qwen (a copy that never stops
generating, so a stream is still running when its node dies), n serves nothing. The tests run in order on one
cluster, each leaving it as the next one expects.
"""

import json
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.cluster.local_cluster import ClusterNode, LocalCluster, local_cluster
from tests.exo_server import fixture_model
from tests.fixtures.endless_model import MODEL as ENDLESS_MODEL
from tests.fixtures.endless_model import endless_copy
from tests.fixtures.fixture_specs import GREETING_REPLY, user

QWEN = "tiny-qwen-tools"
# The promise; the lease that detects a silent node is 6 s.
DOWN_WITHIN_S = 10.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    endless = endless_copy(tmp_path_factory.mktemp("models"))
    with local_cluster(tmp_path_factory.mktemp("failover"), "e2e-failover") as running:
        m1 = running.start("m1", [fixture_model(QWEN)])  # first, so it is the master
        for node in (running.launch("m2", [endless], peers=[m1]), running.launch("n", peers=[m1])):
            running.wait_ready(node)
        running.settled_states(running.nodes)
        yield running


def live(cluster: LocalCluster, name: str) -> ClusterNode:
    """The running process of node `name` (the latest one, after a restart)."""
    return next(node for node in reversed(cluster.nodes) if node.name == name)


def health(observer: ClusterNode, subject: ClusterNode) -> str:
    return str(observer.state()["nodes"][subject.node_id]["health"]["status"])


def greeting(target: ClusterNode, model: str) -> str:
    body = {"model": model, "messages": [user("Hello!")], "max_tokens": 32}
    response = httpx.post(f"{target.base_url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["message"]["content"])


def wait_down(cluster: LocalCluster, observers: list[ClusterNode], subject: ClusterNode, since: float) -> float:
    """Seconds from `since` until every observer shows `subject` down."""
    for observer in observers:
        cluster.wait_until(observer, lambda o=observer: health(o, subject) == "down", f"{subject.name} down", 30)
    return time.monotonic() - since


def test_a_crashed_node_is_down_within_10_s_and_the_rest_keep_serving(cluster: LocalCluster) -> None:
    m1, m2, n = live(cluster, "m1"), live(cluster, "m2"), live(cluster, "n")
    crashed_at = time.monotonic()
    cluster.crash(n)
    assert wait_down(cluster, [m1, m2], n, crashed_at) < DOWN_WITHIN_S
    state = cluster.settled_states([m1, m2])
    assert state["nodes"][n.node_id]["health"]["reason"] == "left the cluster (its liveliness token is gone)"
    assert greeting(m1, ENDLESS_MODEL) == greeting(m2, ENDLESS_MODEL)
    assert greeting(m2, QWEN).startswith(GREETING_REPLY)


def test_a_restarted_node_comes_back_as_itself(cluster: LocalCluster) -> None:
    m1, old = live(cluster, "m1"), live(cluster, "n")
    n = cluster.restart(old, peers=[m1])
    assert n.node_id == old.node_id
    state = cluster.settled_states([m1, live(cluster, "m2"), n])
    assert len(state["nodes"]) == 3  # no ghost: the same entry is healthy again
    assert state["nodes"][n.node_id]["health"]["status"] == "healthy"
    assert state["master_node_id"] == m1.node_id  # a returning node does not take over


def test_a_frozen_node_is_down_within_10_s_and_rejoins_when_it_thaws(cluster: LocalCluster) -> None:
    m1, m2, n = live(cluster, "m1"), live(cluster, "m2"), live(cluster, "n")
    frozen_at = time.monotonic()
    n.signal_group(signal.SIGSTOP)  # no socket closes: only the missed keep-alives tell
    try:
        assert wait_down(cluster, [m1, m2], n, frozen_at) < DOWN_WITHIN_S
        assert greeting(m2, QWEN).startswith(GREETING_REPLY)
    finally:
        n.signal_group(signal.SIGCONT)
    cluster.wait_until(m1, lambda: health(m1, n) == "healthy", "the thawed node to rejoin", 60)
    state = cluster.settled_states([m1, m2, n])
    assert state["master_node_id"] == m1.node_id
    assert greeting(n, ENDLESS_MODEL) == greeting(m2, ENDLESS_MODEL)


def test_a_stream_whose_owning_node_dies_ends_with_an_error_and_the_model_leaves(cluster: LocalCluster) -> None:
    m2, n = live(cluster, "m2"), live(cluster, "n")
    body = {"model": ENDLESS_MODEL, "messages": [user("Tell me a long story.")], "max_tokens": 3000, "stream": True}
    events: list[str] = []
    with httpx.stream("POST", f"{n.base_url}/v1/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        for line in lines:
            if '"content":"' in line and '"content":""' not in line:
                break  # m2 is generating
        cluster.crash(m2)
        events = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    errors = [json.loads(event)["error"] for event in events[:-1] if '"error"' in event]
    assert len(errors) == 1
    assert "left the cluster" in errors[0]["message"]
    cluster.wait_until(n, lambda: health(n, m2) == "down", "m2 down", 30)
    assert [card["id"] for card in n.get("/v1/models")["data"]] == [QWEN]
    response = httpx.post(f"{n.base_url}/v1/chat/completions", json={**body, "stream": False}, timeout=30)
    assert response.status_code == 404


def test_killing_the_master_elects_another_within_10_s_that_keeps_serving(cluster: LocalCluster) -> None:
    m1, n = live(cluster, "m1"), live(cluster, "n")
    m2 = cluster.restart(live(cluster, "m2"), peers=[m1])
    cluster.settled_states([m1, m2, n])
    crashed_at = time.monotonic()
    cluster.crash(m1)
    # n has run longer than the restarted m2, so n is next.
    for observer in (m2, n):
        cluster.wait_until(observer, lambda o=observer: o.state()["master_node_id"] == n.node_id, "n to be master", 30)
    assert time.monotonic() - crashed_at < DOWN_WITHIN_S
    state: dict[str, Any] = cluster.settled_states([m2, n])
    assert state["nodes"][m1.node_id]["health"]["status"] == "down"
    assert [card["id"] for card in n.get("/v1/models")["data"]] == [ENDLESS_MODEL]
    assert greeting(n, ENDLESS_MODEL) == greeting(m2, ENDLESS_MODEL)
    assert "this node is the cluster master" in n.log()
