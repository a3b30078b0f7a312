"""A model split by layers over two real nodes that both hold weights as ggml's Q8_0 blocks (`--cpu-weights q8_0`,
issue 33 item 3): each pipeline rank converts only its own layers (and the shared weights it keeps) to Q8_0, the
master plans each rank's memory from that quantized size, and the split instance streams the same greedy tool call
as one node under q8_0 for the fixture's trained prompt. Needs ggml's CPU library (a machine skip without it)."""

import json
from collections.abc import Iterator
from typing import Any

import pytest

from exo.master.pipeline_placement import rank_need
from exo.models.footprint import read_footprint
from exo.worker.engines.mlx.cpu.ggml_locate import GGML_DIR_VARIABLE, find_ggml_library, ggml_missing_reason
from tests.cluster.local_cluster import ClusterNode, LocalCluster, local_cluster
from tests.cluster.test_cluster_end_to_end import comparable, stream_events
from tests.cluster.test_cluster_pipeline import DEEP, PLACED_WITHIN_S, TOOL_CALL_BODY
from tests.exo_server import fixture_model
from tests.machine_skips import skip_for_machine

pytestmark = pytest.mark.slow  # three nodes, each loading a model

Q8_0 = ["--cpu-weights", "q8_0"]


@pytest.fixture(scope="module", autouse=True)
def ggml() -> Iterator[None]:
    """The library this process finds, named to the nodes: each has an EXO_HOME of its own, without a build."""
    found = find_ggml_library()
    if found is None:
        skip_for_machine(ggml_missing_reason())
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(GGML_DIR_VARIABLE, str(found))
        yield


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, ClusterNode]]:
    with local_cluster(tmp_path_factory.mktemp("pipeline-q8"), "pipe-q8") as running:
        alpha, beta = running.launch_split(fixture_model(DEEP), both=Q8_0)
        running.wait_until(beta, beta.one_instance_ready, "the model placed over both nodes", PLACED_WITHIN_S)
        yield running, alpha


@pytest.fixture(scope="module")
def solo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterNode]:
    with local_cluster(tmp_path_factory.mktemp("solo-q8"), "pipe-q8-solo") as running:
        node = running.launch("solo", [fixture_model(DEEP)], extra_arguments=Q8_0)
        running.wait_ready(node)
        yield node


def test_each_rank_holds_its_layers_as_q8_0_in_the_memory_planned_for_them(
    pipeline: tuple[LocalCluster, ClusterNode],
) -> None:
    cluster, alpha = pipeline
    (instance,) = alpha.instances().data
    assert instance.world_size == 2
    footprint = read_footprint(fixture_model(DEEP))
    runners: dict[str, dict[str, Any]] = {
        runner["node_id"]: runner
        for runner in cluster.settled_states(cluster.nodes)["runners"].values()
        if runner["instance_id"] == instance.instance_id
    }
    assert len(runners) == 2
    for rank in instance.ranks:
        planned = footprint.rank_bytes(rank.start_layer, rank.end_layer, weights="q8_0")
        # The master planned this rank's share from its layers' Q8_0 size (34 bytes per 32 weights), not float32's.
        assert rank.planned_bytes == rank_need(footprint, rank.start_layer, rank.end_layer, weights="q8_0")
        assert planned < footprint.rank_bytes(rank.start_layer, rank.end_layer, weights="float32") / 3
        runner = runners[rank.node_id]
        assert (runner["shard"]["start_layer"], runner["shard"]["end_layer"]) == (rank.start_layer, rank.end_layer)
        metadata = runner["metadata"]
        assert metadata["dtype"] == "q8_0"
        assert metadata["pipeline"] != "tensor"  # split by layers (mlx-lm's own pipeline for Qwen2)
        # What the rank measured it holds: its blocks and float32 norms (1.3 % over the plan when written).
        assert metadata["weights_bytes"] == pytest.approx(planned, rel=0.05)


def test_the_split_q8_0_model_streams_the_same_tool_call_as_one_q8_0_node(
    pipeline: tuple[LocalCluster, ClusterNode], solo: ClusterNode
) -> None:
    _cluster, alpha = pipeline
    solo_status, expected = stream_events(solo, TOOL_CALL_BODY)
    status, split = stream_events(alpha, TOOL_CALL_BODY)
    assert solo_status == status == 200
    calls = [
        call for event in expected[:-1] for choice in event["choices"] for call in choice["delta"].get("tool_calls", [])
    ]
    # The trained answer survives Q8_0's rounding on one node (its arguments stream over several chunks)...
    assert [call["function"]["name"] for call in calls if "id" in call] == ["get_weather"]
    assert json.loads("".join(call["function"].get("arguments", "") for call in calls)) == {"city": "Paris"}
    # ...and the two ranks give it chunk for chunk (usage aside: each side's prefix cache saw a different history).
    assert comparable(split[:-2]) == comparable(expected[:-2])
    assert split[-2]["usage"]["completion_tokens"] == expected[-2]["usage"]["completion_tokens"]
