"""The `auto` rule (master/split_choice.py): a split asked for is kept; `auto` splits by layers, because a tensor
split waits for two all-sums per layer on the link and the cluster does not measure its links; an instance that
fits on one node says so. The reason reaches `/v1/cluster/instances`."""

import pytest

from exo.api.cluster_views import placed_instance_view
from exo.master.split_choice import (
    PIPELINE_ROUND_TRIPS_PER_TOKEN,
    SplitChoice,
    choose_split,
    placement_reason,
    tensor_round_trips_per_token,
)
from exo.shared.types.events import InstancePlaced
from exo.shared.types.worker.shards import ParallelChoice, Parallelism
from tests.master.placement_builders import FOOTPRINT, nodes_free, place, place_request
from tests.shared.state_builders import NODE_A, NODE_B, fold


@pytest.mark.parametrize("asked", ["pipeline", "tensor"])
def test_a_split_asked_for_is_the_split_given(asked: Parallelism) -> None:
    assert choose_split(asked, FOOTPRINT) == SplitChoice(parallel=asked, reason=f"{asked} asked for")


def test_auto_splits_by_layers_and_says_what_a_tensor_split_would_wait_for() -> None:
    choice = choose_split("auto", FOOTPRINT)
    assert choice.parallel == "pipeline"
    # 8 layers: two all-sums each and the token, against the pipeline's three messages a token.
    assert tensor_round_trips_per_token(8) == 17
    assert "8 layers would wait for 17 round trips per token" in choice.reason
    assert f"the pipeline's {PIPELINE_ROUND_TRIPS_PER_TOKEN}" in choice.reason
    # Deeper models make the matrix split worse, never better.
    assert tensor_round_trips_per_token(64) > tensor_round_trips_per_token(8) > PIPELINE_ROUND_TRIPS_PER_TOKEN


def test_an_auto_placement_over_two_nodes_is_a_pipeline_whose_view_says_why() -> None:
    state = nodes_free((NODE_A, 4), (NODE_B, 4))
    instance = place(state, place_request(2, "auto"))
    assert instance.parallel == "pipeline"
    assert instance.peers is not None
    assert instance.peers.parallel == "pipeline"
    assert instance.parallel_reason == choose_split("auto", FOOTPRINT).reason
    view = placed_instance_view(fold((InstancePlaced(instance=instance), NODE_A), start=state), instance)
    assert (view.parallel, view.parallel_reason) == ("pipeline", instance.parallel_reason)


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
    assert reason == placement_reason(choose_split(asked, FOOTPRINT), 1)
    assert reason is not None
    assert reason.startswith("on one node, which holds the whole model")
