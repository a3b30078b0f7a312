"""One model split by its matrices (tensor parallel) over two real nodes on 127.0.0.1, beside the pipeline's test.

alpha holds tiny-qwen-tools-deep (4 attention heads, 2 KV heads, MLP width 128) and is started with `--min-nodes 2
--parallel tensor`: once beta (`--no-model`) is up, the master places it over both, each rank running every layer
with half of its heads, and beta copies the whole checkpoint from alpha. A third node, solo, serves the same model
whole: the split instance must stream the same tool call and text, chunk for chunk. A model whose head counts do not
divide over the 2 nodes is refused with a 400 naming them. A split that loses a node is served whole by the survivor
(degraded) and split by matrices again when the node returns.
"""

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.cluster.local_cluster import ClusterNode, LocalCluster, local_cluster
from tests.cluster.test_cluster_end_to_end import comparable, stream_events
from tests.exo_server import fixture_model
from tests.fixtures.fixture_specs import GET_WEATHER_TOOL, user

DEEP = "tiny-qwen-tools-deep"
PLACED_WITHIN_S = 240.0
TOOL_CALL_BODY: dict[str, Any] = {
    "model": DEEP,
    "messages": [user("What is the weather in Paris?")],
    "tools": [GET_WEATHER_TOOL],
}
CASES: dict[str, dict[str, Any]] = {
    "streamed tool call": TOOL_CALL_BODY,
    "plain text": {"model": DEEP, "messages": [user("Hello!")]},
    "two parallel calls": {**TOOL_CALL_BODY, "messages": [user("What is the weather in Paris and Tokyo?")]},
}


@pytest.fixture(scope="module")
def tensor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, ClusterNode, ClusterNode]]:
    with local_cluster(tmp_path_factory.mktemp("tensor"), "tensor-two") as running:
        alpha, beta = running.launch_split(fixture_model(DEEP), "tensor")
        running.wait_until(beta, beta.one_instance_ready, "the model split over both nodes", PLACED_WITHIN_S)
        yield running, alpha, beta


@pytest.fixture(scope="module")
def solo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterNode]:
    with local_cluster(tmp_path_factory.mktemp("solo"), "tensor-solo") as running:
        yield running.start("solo", [fixture_model(DEEP)])


def test_every_rank_runs_every_layer_and_the_node_without_weights_copied_the_whole_checkpoint(
    tensor: tuple[LocalCluster, ClusterNode, ClusterNode],
) -> None:
    cluster, alpha, beta = tensor
    (instance,) = beta.instances().data
    assert (instance.model_id, instance.parallel, instance.world_size) == (DEEP, "tensor", 2)
    assert {rank.node_id for rank in instance.ranks} == {alpha.node_id, beta.node_id}
    assert [(rank.start_layer, rank.end_layer) for rank in instance.ranks] == [(0, 4), (0, 4)]
    copied = cluster.work_dir / "models-beta" / "from-peers" / DEEP
    source = fixture_model(DEEP)
    assert sorted(path.name for path in copied.glob("*.safetensors")) == sorted(
        path.name for path in source.glob("*.safetensors")
    )
    state = cluster.settled_states([alpha, beta])
    shards = [runner["shard"] for runner in state["runners"].values() if runner["instance_id"] == instance.instance_id]
    assert sorted(shard["rank"] for shard in shards) == [0, 1]
    assert all(shard["peers"]["parallel"] == "tensor" for shard in shards)


@pytest.mark.parametrize("case", list(CASES))
def test_the_tensor_split_answers_as_one_node(
    tensor: tuple[LocalCluster, ClusterNode, ClusterNode], solo: ClusterNode, case: str
) -> None:
    _cluster, alpha, beta = tensor
    solo_status, expected = stream_events(solo, CASES[case])
    for node in (alpha, beta):
        status, split = stream_events(node, CASES[case])
        assert solo_status == status == 200
        # Usage aside (each side's prefix cache has seen a different history), every chunk is the same.
        assert comparable(split[:-2]) == comparable(expected[:-2])
        assert split[-2]["usage"]["completion_tokens"] == expected[-2]["usage"]["completion_tokens"]
    calls = [
        call for event in expected[:-1] for choice in event["choices"] for call in choice["delta"].get("tool_calls", [])
    ]
    if case != "plain text":
        assert calls
        assert calls[0]["function"]["name"] == "get_weather"


def test_a_model_whose_heads_do_not_divide_over_the_nodes_is_refused_with_the_counts(
    tensor: tuple[LocalCluster, ClusterNode, ClusterNode], tmp_path: Path
) -> None:
    _cluster, alpha, _beta = tensor
    odd = tmp_path / "tiny-qwen-odd-heads"
    shutil.copytree(fixture_model("tiny-qwen-tools"), odd)
    config = json.loads((odd / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps({**config, "num_attention_heads": 3, "num_key_value_heads": 1}))
    body = {"model": str(odd), "min_nodes": 2, "parallel": "tensor"}
    response = httpx.post(f"{alpha.base_url}/v1/cluster/instances", json=body, timeout=60)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "indivisible_heads", "parallel")
    assert "attention heads and KV heads do not divide by 2" in error["message"]
    assert "(attention heads 3, KV heads 1, MLP width 128)" in error["message"]
    # The instance already placed is untouched.
    assert alpha.one_instance_ready()


def test_a_tensor_split_that_loses_a_node_is_served_by_the_survivor_and_split_again_when_it_returns(
    tmp_path: Path,
) -> None:
    chat: dict[str, Any] = {"model": DEEP, "messages": [user("Hello!")], "max_tokens": 4}
    with local_cluster(tmp_path, "tensor-degraded") as cluster:
        alpha, beta = cluster.launch_split(fixture_model(DEEP), "tensor")
        cluster.wait_until(alpha, lambda: alpha.serving(2) is not None, "the model split", PLACED_WITHIN_S)
        cluster.crash(beta)
        alone = cluster.wait_serving(alpha, 1, "the model served alone", PLACED_WITHIN_S)
        assert (alone.degraded, alone.parallel, alone.min_nodes) == (True, "tensor", 2)
        assert [(rank.node_id, rank.start_layer, rank.end_layer) for rank in alone.ranks] == [(alpha.node_id, 0, 4)]
        answer = httpx.post(f"{alpha.base_url}/v1/chat/completions", json=chat, timeout=60)
        assert answer.status_code == 200, answer.text
        beta = cluster.restart(beta, peers=[alpha])
        again = cluster.wait_serving(alpha, 2, "the model split again", PLACED_WITHIN_S)
        assert (again.degraded, again.parallel, again.replaces) == (False, "tensor", alone.instance_id)
        assert {rank.node_id for rank in again.ranks} == {alpha.node_id, beta.node_id}
        answer = httpx.post(f"{beta.base_url}/v1/chat/completions", json=chat, timeout=60)
        assert answer.status_code == 200, answer.text
