"""The `auto` rule (master/split_choice.py, master/split_estimates.py): a split asked for is kept; `auto` weighs one
node, a pipeline and a tensor split by estimated time per token (compute from the nodes' measured memory bandwidth,
exchanges times the measured round trip; the transfer term, with link bandwidth, in test_split_transfer.py) and
takes the least, naming the figures; without the measurements it
splits by layers and says what it lacked. The reason reaches `/v1/cluster/instances`.

The footprint (placement_builders.FOOTPRINT) is 8 layers of 0.4 GB in float32 and 0.4 GB outside them: one node
reads 3.6 GB a token, a rank of a 2-node tensor split 2.0 GB, and the tensor split waits for 17 exchanges a token
against the pipeline's 3."""

import pytest

from exo.api.cluster_views import placed_instance_view
from exo.master.split_choice import (
    PIPELINE_ROUND_TRIPS_PER_TOKEN,
    SplitChoice,
    SplitEstimate,
    choose_split,
    placement_reason,
    tensor_round_trips_per_token,
)
from exo.shared.types.events import InstancePlaced
from exo.shared.types.worker.shards import ParallelChoice, Parallelism
from tests.master.placement_builders import FOOTPRINT, nodes_free, nodes_measured, place, place_request
from tests.shared.state_builders import NODE_A, NODE_B, fold

# The transfer each candidate's reason names, not counted: these links' bandwidth is not measured.
TENSOR_NO_BW = "; transfer of 128.2 KiB not counted: link bandwidth not measured"
PIPELINE_NO_BW = "; transfer of 8.2 KiB not counted: link bandwidth not measured"


def estimate(parallel: Parallelism, size: int, compute: float | None, trip: float | None) -> SplitEstimate:
    """A candidate over a link whose bandwidth is not measured (tests/master/test_split_transfer.py weighs it)."""
    exchanges = 0 if size == 1 else (17 if parallel == "tensor" else 3)
    missing = () if compute is not None and trip is not None else ("the round trip between a and b",)
    return SplitEstimate(
        parallel=parallel,
        world_size=size,
        compute_ms=compute,
        exchanges=exchanges,
        round_trip_ms=0.0 if size == 1 else trip,
        transfer_bytes=0 if size == 1 else (131_328 if parallel == "tensor" else 8_448),
        missing=missing,
    )


@pytest.mark.parametrize("asked", ["pipeline", "tensor"])
def test_a_split_asked_for_is_the_split_given(asked: Parallelism) -> None:
    assert choose_split(asked, FOOTPRINT) == SplitChoice(parallel=asked, reason=f"{asked} asked for")


def test_the_rule_takes_the_least_estimated_time_per_token_and_names_every_figure() -> None:
    fast = [estimate("pipeline", 2, 360.0, 0.1), estimate("tensor", 2, 200.0, 0.1)]
    choice = choose_split("auto", FOOTPRINT, fast)
    assert (choice.parallel, choice.world_size) == ("tensor", 2)
    assert choice.reason == (
        f"auto: tensor over 2 nodes est. 201.7 ms/token (compute 200.0 + 17 × 0.100 ms round trip{TENSOR_NO_BW}) "
        f"against pipeline over 2 nodes est. 360.3 ms/token (compute 360.0 + 3 × 0.100 ms round trip{PIPELINE_NO_BW})"
    )
    # The same compute over a slow link: 17 exchanges of 20 ms cost more than the compute the split saves.
    slow = [estimate("pipeline", 2, 360.0, 20.0), estimate("tensor", 2, 200.0, 20.0)]
    choice = choose_split("auto", FOOTPRINT, slow)
    assert (choice.parallel, choice.world_size) == ("pipeline", 2)
    assert choice.reason.startswith("auto: pipeline over 2 nodes est. 420.0 ms/token (compute 360.0 + 3 × 20.0 ms")


def test_without_a_figure_auto_splits_by_layers_and_names_what_was_not_measured() -> None:
    choice = choose_split("auto", FOOTPRINT, [estimate("pipeline", 2, 360.0, None), estimate("tensor", 2, 200.0, None)])
    assert (choice.parallel, choice.world_size) == ("pipeline", None)
    assert "auto: by layers (not measured yet: the round trip between a and b)" in choice.reason
    # 8 layers: two all-sums each and the token, against the pipeline's three messages a token.
    assert tensor_round_trips_per_token(8) == 17
    assert "8 layers would wait for 17 round trips per token" in choice.reason
    assert f"the pipeline's {PIPELINE_ROUND_TRIPS_PER_TOKEN}" in choice.reason


def test_a_fast_link_and_heavy_compute_place_a_tensor_split_whose_view_shows_the_figures() -> None:
    state = nodes_measured(4, NODE_A, NODE_B, bandwidth_gb_s=10, round_trip_ms=0.1)
    instance = place(state, place_request(2, "auto"))
    assert instance.parallel == "tensor"
    assert instance.peers is not None
    assert instance.peers.parallel == "tensor"
    assert [(rank.start_layer, rank.end_layer) for rank in instance.ranks] == [(0, 8), (0, 8)]
    # 2.0 GB a rank at 10 GB/s, 17 exchanges of 0.1 ms; the pipeline reads 3.6 GB along its two ranks.
    assert instance.parallel_reason == (
        f"auto: tensor over 2 nodes est. 201.7 ms/token (compute 200.0 + 17 × 0.100 ms round trip{TENSOR_NO_BW}) "
        f"against pipeline over 2 nodes est. 360.3 ms/token (compute 360.0 + 3 × 0.100 ms round trip{PIPELINE_NO_BW})"
    )
    view = placed_instance_view(fold((InstancePlaced(instance=instance), NODE_A), start=state), instance)
    assert (view.parallel, view.parallel_reason) == ("tensor", instance.parallel_reason)


def test_a_slow_link_places_a_pipeline() -> None:
    state = nodes_measured(4, NODE_A, NODE_B, bandwidth_gb_s=10, round_trip_ms=20)
    instance = place(state, place_request(2, "auto"))
    assert instance.parallel == "pipeline"
    assert instance.parallel_reason is not None
    assert instance.parallel_reason.startswith("auto: pipeline over 2 nodes est. 420.0 ms/token")
    assert f"tensor over 2 nodes est. 540.0 ms/token (compute 200.0 + 17 × 20.0 ms round trip{TENSOR_NO_BW})" in (
        instance.parallel_reason
    )


def test_a_model_one_node_holds_goes_on_one_node_unless_a_split_is_faster() -> None:
    slow = place(nodes_measured(8, NODE_A, NODE_B, bandwidth_gb_s=10, round_trip_ms=20), place_request(1, "auto"))
    assert len(slow.ranks) == 1
    assert slow.parallel_reason is not None
    assert slow.parallel_reason.startswith("auto: one node est. 360.0 ms/token (compute 360.0, no link) against ")
    fast = place(nodes_measured(8, NODE_A, NODE_B, bandwidth_gb_s=10, round_trip_ms=0.1), place_request(1, "auto"))
    assert (fast.parallel, len(fast.ranks)) == ("tensor", 2)
    assert "against one node est. 360.0 ms/token" in (fast.parallel_reason or "")


@pytest.mark.parametrize(
    ("bandwidth", "trip", "lacking"),
    [
        (10.0, None, "the round trip between a0000000000000000000000000000001 and b0000000000000000000000000000002"),
        (None, 0.1, "the memory bandwidth of a0000000000000000000000000000001"),
    ],
)
def test_an_auto_placement_without_measurements_is_a_pipeline_that_says_what_it_lacked(
    bandwidth: float | None, trip: float | None, lacking: str
) -> None:
    state = nodes_measured(4, NODE_A, NODE_B, bandwidth_gb_s=bandwidth, round_trip_ms=trip)
    instance = place(state, place_request(2, "auto"))
    assert instance.parallel == "pipeline"
    assert instance.peers is not None
    assert instance.peers.parallel == "pipeline"
    assert instance.parallel_reason is not None
    assert instance.parallel_reason.startswith("auto: by layers (not measured yet: ")
    assert lacking in instance.parallel_reason
    # Each figure named once, though several candidates lack it.
    assert instance.parallel_reason.count(lacking) == 1


def test_a_tensor_placement_says_it_was_asked_for() -> None:
    state = nodes_free((NODE_A, 4), (NODE_B, 4))
    instance = place(state, place_request(2, "tensor"))
    assert (instance.parallel, instance.parallel_reason) == ("tensor", "tensor asked for")


@pytest.mark.parametrize("asked", ["auto", "tensor"])
def test_a_model_one_node_holds_goes_on_one_node_and_says_so(asked: ParallelChoice) -> None:
    state = nodes_free((NODE_A, 8), (NODE_B, 8))
    instance = place(state, place_request(1, asked))
    assert len(instance.ranks) == 1
    assert instance.peers is None
    reason = instance.parallel_reason
    assert reason is not None
    assert reason.startswith("on one node, which holds the whole model")
    if asked == "auto":  # the nodes reported no measurements
        assert "auto: by layers (not measured yet: the memory bandwidth of" in reason
    else:
        assert reason == placement_reason(choose_split(asked, FOOTPRINT), 1)
