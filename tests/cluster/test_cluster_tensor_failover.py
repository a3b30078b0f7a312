"""A node of a tensor split killed mid-stream, over two real nodes on 127.0.0.1: the stream in flight ends with the
dialect's error event within 2 s (issue 34), and the model serves again on the survivor.

alpha holds an endless copy of tiny-qwen-tools-deep (it generates until max_tokens) and asks for it split by its
matrices over two nodes (`--min-nodes 2 --parallel tensor`); beta holds nothing and copies the checkpoint. While a
stream asked of alpha is generating, beta (and its runner) is SIGKILLed, as when a machine dies. Every token of a
tensor split needs every rank (two all-sums per layer), so the survivor's rank notices at its next all-sum.
"""

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.cluster.local_cluster import LocalCluster, crash_mid_stream, local_cluster
from tests.fixtures.endless_model import MODEL, endless_copy
from tests.fixtures.fixture_specs import user

PLACED_WITHIN_S = 240.0
ERROR_WITHIN_S = 2.0


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    endless = endless_copy(tmp_path_factory.mktemp("models"), source="tiny-qwen-tools-deep")
    with local_cluster(tmp_path_factory.mktemp("tensor-failover"), "tensor-failover") as running:
        running.launch_split(endless, "tensor")
        yield running


def test_a_stream_on_a_tensor_split_whose_other_node_dies_ends_with_an_error_within_2_s(cluster: LocalCluster) -> None:
    alpha, beta = cluster.nodes
    split = cluster.wait_serving(alpha, 2, "the tensor split", PLACED_WITHIN_S)
    assert (split.parallel, split.parallel_reason) == ("tensor", "tensor asked for")
    beta_rank = next(rank.rank for rank in split.ranks if rank.node_id == beta.node_id)
    body = {"model": MODEL, "messages": [user("Hello!")], "max_tokens": 3000, "stream": True}
    events, ended_after = crash_mid_stream(cluster, alpha, beta, body)
    assert events[-1] == "[DONE]"
    errors = [json.loads(event)["error"] for event in events[:-1] if '"error"' in event]
    assert len(errors) == 1, events[-5:]
    print(f"\nthe stream ended {ended_after * 1000:.0f} ms after rank {beta_rank}'s node was killed: {errors[0]}")
    assert errors[0]["message"]
    assert ended_after < ERROR_WITHIN_S, f"ended {ended_after:.2f} s after the kill"
    # Served again, whole, by the survivor.
    alone = cluster.wait_serving(alpha, 1, "the model on alpha alone", PLACED_WITHIN_S)
    assert [rank.node_id for rank in alone.ranks] == [alpha.node_id]
    # Placed again by the master on its own: the reason its split was chosen is kept.
    assert (alone.parallel, alone.parallel_reason) == ("tensor", "tensor asked for")
    answer = httpx.post(
        f"{alpha.base_url}/v1/chat/completions", json={**body, "stream": False, "max_tokens": 8}, timeout=120
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == 8
