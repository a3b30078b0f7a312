"""Placing an instance from the cluster state: the nodes up and their free memory, the ranks' layers and addresses,
the refusal naming the memory, and the instance's life in the state (placed, viewed, removed)."""

import pytest

from exo.api.cluster_views import placed_instance_view
from exo.master.pipeline_placement import (
    RUNTIME_OVERHEAD_BYTES,
    RUNTIME_OVERHEAD_FRACTION,
    PlacementError,
    rank_need,
)
from exo.shared.types.common import InstanceId
from exo.shared.types.events import InstancePlaced, InstanceRemoved, NodeDown
from tests.master.placement_builders import FOOTPRINT, nodes_free, place, place_request
from tests.shared.state_builders import NODE_A, NODE_B, NODE_C, fold, reported


def test_an_instance_over_two_nodes_gets_layers_by_memory_and_ring_addresses_by_rank() -> None:
    state = nodes_free((NODE_A, 2), (NODE_B, 6), (NODE_C, 1))
    instance = place(state, place_request(2))
    # The two nodes with most memory; rank 0 (the last layers) on the one with most.
    assert [rank.node_id for rank in instance.ranks] == [NODE_B, NODE_A]
    assert [(rank.start_layer, rank.end_layer) for rank in instance.ranks] == [(2, 8), (0, 2)]
    assert instance.peers is not None
    host_b = state.nodes[NODE_B].facts.cluster_endpoints[0].removeprefix("tcp/").split(":")[0]
    host_a = state.nodes[NODE_A].facts.cluster_endpoints[0].removeprefix("tcp/").split(":")[0]
    assert instance.peers.ring_addresses == (f"{host_b}:21000", f"{host_a}:21001")
    assert instance.peers.task_address == f"{host_b}:21002"
    shard = instance.shard(1)
    assert (shard.rank, shard.world_size, shard.start_layer, shard.end_layer) == (1, 2, 0, 2)


def test_a_model_that_fits_nowhere_is_refused_with_the_memory_needed_and_available() -> None:
    state = nodes_free((NODE_A, 0.5), (NODE_B, 0.5))
    with pytest.raises(PlacementError) as refused:
        place(state, place_request(2))
    message = str(refused.value)
    assert "needs 3." in message
    assert f"{NODE_A} 0.50 GiB" in message
    assert f"{NODE_B} 0.50 GiB" in message


def test_placement_plans_the_dtype_a_cpu_node_publishes_it_loads() -> None:
    """A CPU node under `--cpu-kernels auto` loads float32 (4 bytes a parameter: 3.94 GiB planned here); one started
    with `--cpu-kernels off` serves the checkpoint as stored (2 bytes: 2.09 GiB), so 3 GiB holds the model there
    only."""
    auto = fold((reported(NODE_A, available_gib=3, cpu_kernels="auto"), NODE_A))
    with pytest.raises(PlacementError, match=r"needs 3\.94 GiB"):
        place(auto, place_request(1))
    off = fold((reported(NODE_A, available_gib=3, cpu_kernels="off"), NODE_A))
    instance = place(off, place_request(1))
    assert off.nodes[NODE_A].facts.cpu_kernels == "off"
    stored = FOOTPRINT.total_bytes(weights="stored")
    assert [rank.planned_bytes for rank in instance.ranks] == [rank_need(FOOTPRINT, 0, 8, weights="stored")]
    assert instance.ranks[0].planned_bytes == int(stored * (1 + RUNTIME_OVERHEAD_FRACTION)) + RUNTIME_OVERHEAD_BYTES


def test_placement_plans_int8_weights_from_a_node_started_with_cpu_weights_int8() -> None:
    """`--cpu-weights int8`: about a byte a parameter (0.93 GiB planned here), so 3 GiB holds the model that needs
    3.94 GiB in float32; under `--cpu-kernels off` the setting does not apply (stored bytes)."""
    int8 = fold((reported(NODE_A, available_gib=3, cpu_weights="int8"), NODE_A))
    assert int8.nodes[NODE_A].facts.weights_in_memory == "int8"
    instance = place(int8, place_request(1))
    assert [rank.planned_bytes for rank in instance.ranks] == [rank_need(FOOTPRINT, 0, 8, weights="int8")]
    assert instance.ranks[0].planned_bytes < rank_need(FOOTPRINT, 0, 8, weights="stored")
    off = fold((reported(NODE_A, available_gib=3, cpu_kernels="off", cpu_weights="int8"), NODE_A))
    assert off.nodes[NODE_A].facts.weights_in_memory == "stored"


def test_placement_plans_q8_0_or_the_kept_gguf_from_a_node_whose_auto_found_ggml() -> None:
    """`--cpu-weights auto` with ggml's library found (the node publishes `gguf_or_q8_0`): a model without a kept GGUF
    is planned at Q8_0's 34 bytes per 32 weights (0.98 GiB here, where float32 would need 3.94 GiB), one with its
    GGUF at the file's tensor bytes; a node without ggml publishes float32 and plans so."""
    auto = fold((reported(NODE_A, available_gib=3, cpu_weights="gguf_or_q8_0"), NODE_A))
    assert auto.nodes[NODE_A].facts.weights_in_memory == "gguf_or_q8_0"
    instance = place(auto, place_request(1))
    assert [rank.planned_bytes for rank in instance.ranks] == [rank_need(FOOTPRINT, 0, 8, weights="q8_0")]
    kept = FOOTPRINT.model_copy(update={"layer_gguf_bytes": (60_000_000,) * 8, "shared_gguf_bytes": 80_000_000})
    assert rank_need(kept, 0, 8, weights="gguf_or_q8_0") == rank_need(kept, 0, 8, weights="gguf")
    assert rank_need(kept, 0, 8, weights="gguf") < rank_need(FOOTPRINT, 0, 8, weights="q8_0")
    small = fold((reported(NODE_A, available_gib=0.5, cpu_weights="gguf_or_q8_0"), NODE_A))
    with pytest.raises(PlacementError, match="with its weights held as q8_0"):
        place(small, place_request(1))
    without = fold((reported(NODE_A, available_gib=3, cpu_weights="float32"), NODE_A))
    with pytest.raises(PlacementError, match=r"needs 3\.94 GiB"):
        place(without, place_request(1))


def test_a_node_that_is_down_is_not_placed_on() -> None:
    state = fold(
        (reported(NODE_A, available_gib=8), NODE_A),
        (reported(NODE_B, available_gib=8), NODE_B),
        (NodeDown(node_id=NODE_B, reason="left"), NODE_A),
    )
    with pytest.raises(PlacementError, match="only 1 are up"):
        place(state, place_request(2))


def test_an_instance_is_in_the_state_until_removed_and_its_view_names_each_rank() -> None:
    state = nodes_free((NODE_A, 4), (NODE_B, 4))
    instance = place(state, place_request(2))
    placed = fold((InstancePlaced(instance=instance), NODE_A), start=state)
    view = placed_instance_view(placed, placed.instances[InstanceId("i1")])
    assert (view.world_size, view.ready, view.files_from) == (2, False, NODE_A)
    assert [(rank.rank, rank.start_layer, rank.end_layer, rank.runner_id) for rank in view.ranks] == [
        (0, 4, 8, None),
        (1, 0, 4, None),
    ]
    removed = fold((InstanceRemoved(instance_id=InstanceId("i1"), reason="node left"), NODE_A), start=placed)
    assert removed.instances == {}
