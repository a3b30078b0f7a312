"""Availability first, with real nodes on 127.0.0.1: a split model that loses a node keeps being served.

alpha holds tiny-qwen-tools-deep and asks for it over two nodes (`--min-nodes 2`); beta holds nothing. While only
alpha is up the model cannot be placed: every dialect answers 503 `model_unavailable` with Retry-After and the
reason, never 404. Once beta is up the model is split over both; when beta dies alpha serves it alone (degraded, in
/state and /v1/cluster/instances); when beta returns the model goes back over two nodes, and requests sent all
through that change are answered.
"""

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.cluster.local_cluster import ClusterNode, LocalCluster, local_cluster
from tests.exo_server import fixture_model
from tests.fixtures.fixture_specs import user

DEEP = "tiny-qwen-tools-deep"
PLACED_WITHIN_S = 240.0
CHAT: dict[str, Any] = {"model": DEEP, "messages": [user("Hello!")], "max_tokens": 4}


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_cluster(tmp_path_factory.mktemp("degraded"), "degraded") as running:
        yield running


def _unavailable_in_every_dialect(node: ClusterNode) -> None:
    """Chat Completions, Messages and Responses each answer 503 model_unavailable, Retry-After and the reason."""
    requests = [
        ("/v1/chat/completions", CHAT),
        ("/v1/messages", {"model": DEEP, "max_tokens": 4, "messages": [{"role": "user", "content": "Hello!"}]}),
        ("/v1/responses", {"model": DEEP, "input": "Hello!", "max_output_tokens": 16}),
    ]
    for path, body in requests:
        response = httpx.post(f"{node.base_url}{path}", json=body, timeout=30)
        assert response.status_code == 503, (path, response.text)
        assert int(response.headers["Retry-After"]) > 0, path
        error = response.json()["error"]
        assert "nodes up: 1; asked for: 2" in error["message"], (path, error)
        assert f"model '{DEEP}' is unavailable" in error["message"], (path, error)
        if path != "/v1/messages":  # Anthropic's error shape has no code
            assert error["code"] == "model_unavailable", (path, error)


def test_unplaceable_then_split_then_degraded_then_split_again(cluster: LocalCluster) -> None:
    alpha = cluster.launch("alpha", [fixture_model(DEEP)], extra_arguments=["--min-nodes", "2"])
    cluster.wait_until(alpha, lambda: bool(alpha.instances().unplaced), "the placement refused", PLACED_WITHIN_S)
    (unplaced,) = alpha.instances().unplaced
    assert unplaced.model_id == DEEP
    assert "only 1 are up" in unplaced.reason
    _unavailable_in_every_dialect(alpha)

    beta = cluster.launch("beta", peers=[alpha])
    cluster.wait_until(alpha, lambda: alpha.serving(2) is not None, "the model split over both", PLACED_WITHIN_S)
    split = alpha.serving(2)
    assert split is not None
    assert not split.degraded
    assert alpha.instances().unplaced == []

    # beta dies: alpha holds every file and has the memory, so it serves the model alone.
    cluster.crash(beta)
    crashed_at = time.monotonic()
    cluster.wait_until(alpha, lambda: alpha.serving(1) is not None, "the model served alone", PLACED_WITHIN_S)
    print(f"served alone {time.monotonic() - crashed_at:.1f} s after its peer was killed")  # for docs/CLUSTER.md
    alone = alpha.serving(1)
    assert alone is not None
    assert alone.degraded
    assert alone.min_nodes == 2
    assert alone.degraded_reason == "on 1 of the 2 nodes asked for: only 1 node(s) are up"
    assert [rank.node_id for rank in alone.ranks] == [alpha.node_id]
    assert alpha.state()["instances"][alone.instance_id]["degraded_reason"] == alone.degraded_reason
    answer = httpx.post(f"{alpha.base_url}/v1/chat/completions", json=CHAT, timeout=60)
    assert answer.status_code == 200, answer.text

    # beta returns: the model goes back over both nodes while a client keeps asking; no request fails.
    statuses: list[int] = []
    failures: list[str] = []
    stop = threading.Event()

    def keep_asking() -> None:
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                response = client.post(f"{alpha.base_url}/v1/chat/completions", json=CHAT)
                statuses.append(response.status_code)
                if response.status_code != 200:
                    failures.append(response.text)

    asker = threading.Thread(target=keep_asking)
    asker.start()
    try:
        beta = cluster.restart(beta, peers=[alpha])
        returned_at = time.monotonic()
        cluster.wait_until(alpha, lambda: alpha.serving(2) is not None, "the model split again", PLACED_WITHIN_S)
        print(f"split again {time.monotonic() - returned_at:.1f} s after its peer was back")
        time.sleep(1.0)  # a few requests on the new instance too
    finally:
        stop.set()
        asker.join()
    again = alpha.serving(2)
    assert again is not None
    assert not again.degraded
    assert again.replaces == alone.instance_id
    assert {rank.node_id for rank in again.ranks} == {alpha.node_id, beta.node_id}
    assert len(statuses) > 3
    assert set(statuses) == {200}, failures
    state = cluster.settled_states([alpha, beta])
    assert set(state["instances"]) == {again.instance_id}
    assert {runner["instance_id"] for runner in state["runners"].values()} == {again.instance_id}
