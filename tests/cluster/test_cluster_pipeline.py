"""One model split over two real nodes on 127.0.0.1 (explicit peers, mlx.distributed's ring backend).

alpha holds tiny-qwen-tools-deep and is started with `--min-nodes 2`: as soon as beta (`--no-model`, no weights of its
own) is up, the master places the model over both by memory, beta copies its layers' files from alpha over the
cluster, and the two ranks serve it as one instance. A third node, solo, in a cluster of its own, serves the same
model whole: the split instance must stream the same tool call, chunk for chunk.
"""

from collections.abc import Iterator
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


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, ClusterNode, ClusterNode]]:
    with local_cluster(tmp_path_factory.mktemp("pipeline"), "pipe-two") as running:
        alpha, beta = running.launch_split(fixture_model(DEEP))
        running.wait_until(beta, beta.one_instance_ready, "the model placed over both nodes", PLACED_WITHIN_S)
        yield running, alpha, beta


@pytest.fixture(scope="module")
def solo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterNode]:
    with local_cluster(tmp_path_factory.mktemp("solo"), "pipe-solo") as running:
        yield running.start("solo", [fixture_model(DEEP)])


def test_the_model_is_placed_over_both_nodes_with_its_layers_and_ranks_in_the_state(
    pipeline: tuple[LocalCluster, ClusterNode, ClusterNode],
) -> None:
    cluster, alpha, beta = pipeline
    (instance,) = alpha.instances().data
    assert (instance.model_id, instance.world_size, instance.min_nodes) == (DEEP, 2, 2)
    assert instance.files_from == alpha.node_id
    assert {rank.node_id for rank in instance.ranks} == {alpha.node_id, beta.node_id}
    # Four layers: rank 0 the last ones, every rank at least one, all covered once.
    layers = sorted((rank.start_layer, rank.end_layer) for rank in instance.ranks)
    assert layers[0][0] == 0
    assert layers[-1][1] == 4
    assert layers[0][1] == layers[1][0]
    state = cluster.settled_states([alpha, beta])
    assert list(state["instances"]) == [instance.instance_id]
    ranks = sorted(
        (runner["shard"]["rank"], runner["node_id"], runner["status"])
        for runner in state["runners"].values()
        if runner["instance_id"] == instance.instance_id
    )
    assert ranks == [(rank.rank, rank.node_id, "ready") for rank in instance.ranks]


def test_the_node_without_weights_copied_only_its_layers_files_from_its_peer(
    pipeline: tuple[LocalCluster, ClusterNode, ClusterNode],
) -> None:
    cluster, _alpha, beta = pipeline
    (instance,) = beta.instances().data
    (rank,) = [rank for rank in instance.ranks if rank.node_id == beta.node_id]
    copied = cluster.work_dir / "models-beta" / "from-peers" / DEEP
    weights = sorted(path.name for path in copied.glob("*.safetensors"))
    # The deep fixture keeps one layer per file and the shared weights in the last one.
    expected = sorted(
        {f"model-{layer + 1:05d}-of-00005.safetensors" for layer in range(rank.start_layer, rank.end_layer)}
        | {"model-00005-of-00005.safetensors"}
    )
    assert weights == expected
    source = fixture_model(DEEP)
    for name in weights:
        assert (copied / name).read_bytes() == (source / name).read_bytes()
    assert not list(copied.glob(".*.partial"))
    preparation = cluster.settled_states([beta])["nodes"][beta.node_id]["preparations"][DEEP]
    assert preparation["phase"] == "ready"


ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "degrees": {"type": "integer"}},
    "required": ["city", "degrees"],
}
CASES: dict[str, dict[str, Any]] = {
    "streamed tool call": TOOL_CALL_BODY,
    "plain text": {"model": DEEP, "messages": [user("Hello!")]},
    "two parallel calls": {**TOOL_CALL_BODY, "messages": [user("What is the weather in Paris and Tokyo?")]},
    "tool_choice required": {**TOOL_CALL_BODY, "tool_choice": "required"},
    "tool_choice named": {
        **TOOL_CALL_BODY,
        "messages": [user("Hello!")],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    },
    "json_schema": {
        "model": DEEP,
        "messages": [user("What is the weather in Paris?")],
        "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": ANSWER_SCHEMA}},
    },
}


def _tool_calls(events: list[Any]) -> list[Any]:
    return [
        call for event in events[:-1] for choice in event["choices"] for call in choice["delta"].get("tool_calls", [])
    ]


@pytest.mark.parametrize("asked", ["alpha", "beta"])
def test_a_streamed_tool_call_from_the_split_model_matches_one_node(
    pipeline: tuple[LocalCluster, ClusterNode, ClusterNode], solo: ClusterNode, asked: str
) -> None:
    _cluster, alpha, beta = pipeline
    node = alpha if asked == "alpha" else beta
    solo_status, expected = stream_events(solo, TOOL_CALL_BODY)
    status, split = stream_events(node, TOOL_CALL_BODY)
    assert solo_status == status == 200
    calls = _tool_calls(expected)
    assert calls
    assert calls[0]["function"]["name"] == "get_weather"
    # Usage aside (each side's prefix cache has seen a different history), every chunk is the same.
    assert comparable(split[:-2]) == comparable(expected[:-2])
    assert split[-2]["usage"]["completion_tokens"] == expected[-2]["usage"]["completion_tokens"]


@pytest.mark.parametrize("case", [name for name in CASES if name != "streamed tool call"])
def test_every_kind_of_answer_from_the_split_model_matches_one_node(
    pipeline: tuple[LocalCluster, ClusterNode, ClusterNode], solo: ClusterNode, case: str
) -> None:
    _cluster, _alpha, beta = pipeline
    solo_status, expected = stream_events(solo, CASES[case])
    status, split = stream_events(beta, CASES[case])
    assert solo_status == status == 200
    assert comparable(split[:-2]) == comparable(expected[:-2])
    if case == "two parallel calls":
        assert len([call for call in _tool_calls(expected) if "id" in call]) == 2


def test_a_second_turn_reuses_every_ranks_cached_prompt(
    pipeline: tuple[LocalCluster, ClusterNode, ClusterNode],
) -> None:
    _cluster, alpha, _beta = pipeline
    body = {**TOOL_CALL_BODY, "messages": [user("What is the weather in Paris and Tokyo?")], "stream": False}
    first = httpx.post(f"{alpha.base_url}/v1/chat/completions", json=body, timeout=120).json()
    again = httpx.post(f"{alpha.base_url}/v1/chat/completions", json=body, timeout=120).json()
    assert (
        again["choices"][0]["message"]["tool_calls"][0]["function"]
        == first["choices"][0]["message"]["tool_calls"][0]["function"]
    )
    usage = again["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1


def test_placing_over_more_nodes_than_are_up_is_refused_with_the_reason(
    pipeline: tuple[LocalCluster, ClusterNode, ClusterNode],
) -> None:
    _cluster, alpha, _beta = pipeline
    body = {"model": str(fixture_model(DEEP)), "min_nodes": 3}
    response = httpx.post(f"{alpha.base_url}/v1/cluster/instances", json=body, timeout=60)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "insufficient_memory"
    assert "over 3 nodes but only 2 are up" in error["message"]
    # The instance already placed is untouched.
    assert alpha.one_instance_ready()
