"""Placement by memory: the smallest set of nodes that holds the model, layers in proportion to free memory, at least
one each, and a refusal that names the memory needed and available."""

import pytest

from exo.master.pipeline_placement import (
    NodeCapacity,
    PlacementError,
    plan_pipeline,
    rank_need,
    split_layers_by_memory,
)
from exo.shared.types.common import NodeId
from exo.shared.types.footprint import INT8_OVERHEAD, ModelFootprint, WeightsInMemory

GIB = 1024**3
# 24 layers of 100 M parameters, 200 M shared: 0.4 GiB a layer and 0.8 GiB shared in float32.
FOOTPRINT = ModelFootprint(
    layer_parameters=(100_000_000,) * 24,
    shared_parameters=200_000_000,
    layer_file_bytes=(200_000_000,) * 24,
    shared_file_bytes=400_000_000,
)


def _node(name: str, gib: float, *, weights: WeightsInMemory = "float32") -> NodeCapacity:
    return NodeCapacity(node_id=NodeId(name), available_bytes=int(gib * GIB), weights=weights)


def test_a_model_that_fits_on_one_node_goes_on_the_one_with_most_memory() -> None:
    plan = plan_pipeline("m", FOOTPRINT, [_node("small", 8), _node("big", 16)])
    assert (plan.node_ids, plan.layer_counts) == (("big",), (24,))


def test_a_model_too_big_for_any_node_goes_on_the_fewest_nodes_that_hold_it() -> None:
    nodes = [_node("a", 6), _node("b", 6), _node("c", 6), _node("d", 1)]
    plan = plan_pipeline("m", FOOTPRINT, nodes)
    assert plan.node_ids == ("a", "b")
    assert plan.layer_counts == (12, 12)
    assert all(need <= 6 * GIB for need in plan.planned_bytes)


def test_layers_follow_free_memory_and_min_nodes_spreads_a_model_that_would_fit_on_fewer() -> None:
    plan = plan_pipeline("m", FOOTPRINT, [_node("a", 12), _node("b", 6), _node("c", 6)], min_nodes=3)
    assert plan.node_ids == ("a", "b", "c")
    assert plan.layer_counts == (12, 6, 6)
    # Every rank holds the shared weights beside its layers.
    assert plan.planned_bytes[1] == rank_need(FOOTPRINT, 6, 12, weights="float32")


def test_a_node_on_native_weights_needs_the_stored_bytes_only() -> None:
    assert rank_need(FOOTPRINT, 0, 24, weights="stored") < rank_need(FOOTPRINT, 0, 24, weights="float32")
    plan = plan_pipeline("m", FOOTPRINT, [_node("mac", 6, weights="stored")])
    assert plan.layer_counts == (24,)


def test_a_node_on_int8_weights_needs_about_a_byte_a_parameter() -> None:
    """2.6 G parameters: 9.7 GiB in float32, about 2.5 GiB as int8 (a byte each plus 1/32 for scales and norms)."""
    parameters = FOOTPRINT.shared_parameters + sum(FOOTPRINT.layer_parameters)
    assert FOOTPRINT.total_bytes(weights="int8") == int(parameters * (1 + INT8_OVERHEAD))
    assert rank_need(FOOTPRINT, 0, 24, weights="int8") < rank_need(FOOTPRINT, 0, 24, weights="float32") / 3
    with pytest.raises(PlacementError):
        plan_pipeline("m", FOOTPRINT, [_node("cpu", 4)])
    plan = plan_pipeline("m", FOOTPRINT, [_node("cpu", 4, weights="int8")])
    assert plan.layer_counts == (24,)


@pytest.mark.parametrize(
    ("available", "expected"),
    [
        ([1, 1], (12, 12)),
        ([3, 1], (18, 6)),
        ([100, 1, 1], (22, 1, 1)),
        ([1000, 1], (23, 1)),
        ([5, 4, 3], (10, 8, 6)),
    ],
)
def test_the_layer_split_is_proportional_with_at_least_one_layer_each(
    available: list[int], expected: tuple[int, ...]
) -> None:
    assert split_layers_by_memory(24, available) == expected


def test_a_model_that_fits_nowhere_is_refused_with_the_memory_needed_and_available() -> None:
    with pytest.raises(PlacementError) as refused:
        plan_pipeline("big-model", FOOTPRINT, [_node("a", 3), _node("b", 2.5)])
    message = str(refused.value)
    assert "big-model does not fit: it needs 10.90 GiB in all (1.07 GiB on each node" in message
    assert "available: a 3.00 GiB, b 2.50 GiB" in message
    with pytest.raises(PlacementError, match="split over 3 nodes but only 2 are up"):
        plan_pipeline("m", FOOTPRINT, [_node("a", 30), _node("b", 30)], min_nodes=3)
    with pytest.raises(PlacementError, match="has 24 layers: it cannot be split over 25 nodes"):
        plan_pipeline("m", FOOTPRINT, [_node(str(n), 30) for n in range(25)], min_nodes=25)
