"""The master's hold of an `auto` placement for figures on their way (master/placement_hold.py): held while a node
it would weigh joined less than the grace ago and its figures are missing, never longer than the grace, then placed
by layers as before; placed at once when measured, asked for as a split, or going on one node."""

import pytest

from exo.master.instance_placement import same_split_asked
from exo.master.placement_hold import AUTO_FIGURES_GRACE_SECONDS, HeldPlacements, awaited_nodes
from exo.shared.types.worker.shards import ParallelChoice
from tests.master.placement_builders import nodes_free, nodes_measured, place, place_request
from tests.shared.state_builders import NODE_A, NODE_B


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_auto_split_without_figures_waits_at_most_the_grace_then_splits_by_layers() -> None:
    clock = Clock()
    holds = HeldPlacements(clock)
    holds.joined([NODE_A, NODE_B])
    state = nodes_measured(4, NODE_A, NODE_B, bandwidth_gb_s=None, round_trip_ms=None)
    request = place_request(2, "auto")
    assert awaited_nodes(state, request) == {NODE_A, NODE_B}
    assert holds.hold(state, request)
    clock.now += AUTO_FIGURES_GRACE_SECONDS - 0.1
    [(held, since)] = holds.take()
    assert (held, since) == (request, 100.0)
    assert holds.hold(state, held, since)
    # A node that joins meanwhile does not extend the hold: the request waits no longer than the grace.
    holds.joined([NODE_B])
    clock.now += 0.1
    [(held, since)] = holds.take()
    assert not holds.hold(state, held, since)
    assert holds.take() == []
    reason = place(state, held).parallel_reason or ""
    assert reason.startswith("auto: by layers (not measured yet: ")


def test_a_held_split_is_placed_by_the_figures_as_soon_as_they_arrive() -> None:
    clock = Clock()
    holds = HeldPlacements(clock)
    holds.joined([NODE_A, NODE_B])
    request = place_request(2, "auto")
    assert holds.hold(nodes_measured(4, NODE_A, NODE_B, bandwidth_gb_s=10, round_trip_ms=None), request)
    clock.now += 1.0
    [(held, since)] = holds.take()
    measured = nodes_measured(4, NODE_A, NODE_B, bandwidth_gb_s=10, round_trip_ms=0.1)
    assert awaited_nodes(measured, held) == frozenset()
    assert not holds.hold(measured, held, since)
    assert (place(measured, held).parallel_reason or "").startswith("auto: tensor over 2 nodes est. ")


def test_a_split_is_held_while_the_link_figures_settle_after_a_join_and_placed_by_the_settled_ones() -> None:
    clock = Clock()
    holds = HeldPlacements(clock)
    holds.joined([NODE_B])
    request = place_request(2, "auto")
    # At join the link looked slow (15 ms apart): measured, but only in the busy moments of the join.
    busy = nodes_measured(4, NODE_A, NODE_B, bandwidth_gb_s=10, round_trip_ms=15.0, link_mb_s=12, settling=True)
    assert awaited_nodes(busy, request) == {NODE_A, NODE_B}
    assert holds.hold(busy, request)
    clock.now += 3.0
    [(held, since)] = holds.take()
    settled = nodes_measured(4, NODE_A, NODE_B, bandwidth_gb_s=10, round_trip_ms=0.1, link_mb_s=800)
    assert awaited_nodes(settled, held) == frozenset()
    assert not holds.hold(settled, held, since)
    assert (place(settled, held).parallel_reason or "").startswith("auto: tensor over 2 nodes est. ")
    # Weighed by the figures taken at join, the same request would have gone by layers.
    assert (place(busy, request).parallel_reason or "").startswith("auto: pipeline over 2 nodes est. ")


def test_settling_figures_are_weighed_once_the_grace_ends() -> None:
    clock = Clock()
    holds = HeldPlacements(clock)
    holds.joined([NODE_B])
    request = place_request(2, "auto")
    busy = nodes_measured(4, NODE_A, NODE_B, bandwidth_gb_s=10, round_trip_ms=15.0, link_mb_s=12, settling=True)
    assert holds.hold(busy, request)
    clock.now += AUTO_FIGURES_GRACE_SECONDS
    [(held, since)] = holds.take()
    assert not holds.hold(busy, held, since)
    assert (place(busy, held).parallel_reason or "").startswith("auto: pipeline over 2 nodes est. ")


def test_figures_missing_from_nodes_that_joined_longer_ago_than_the_grace_are_not_waited_for() -> None:
    clock = Clock()
    holds = HeldPlacements(clock)
    holds.joined([NODE_A, NODE_B])
    clock.now += AUTO_FIGURES_GRACE_SECONDS
    state = nodes_measured(4, NODE_A, NODE_B, bandwidth_gb_s=10, round_trip_ms=None)
    assert not holds.hold(state, place_request(2, "auto"))
    assert holds.take() == []


@pytest.mark.parametrize("asked", ["pipeline", "tensor"])
def test_a_split_asked_for_is_never_held(asked: ParallelChoice) -> None:
    holds = HeldPlacements(Clock())
    holds.joined([NODE_A, NODE_B])
    state = nodes_measured(4, NODE_A, NODE_B, bandwidth_gb_s=None, round_trip_ms=None)
    assert awaited_nodes(state, place_request(2, asked)) == frozenset()
    assert not holds.hold(state, place_request(2, asked))


def test_a_placement_on_one_node_is_never_held() -> None:
    holds = HeldPlacements(Clock())
    holds.joined([NODE_A, NODE_B])
    # NODE_A holds the model whole: without figures `auto` places it there, so nothing is waited for.
    state = nodes_measured(8, NODE_A, NODE_B, bandwidth_gb_s=None, round_trip_ms=None)
    assert not holds.hold(state, place_request(1, "auto"))
    # One node up: no split to weigh.
    assert not holds.hold(nodes_free((NODE_A, 8)), place_request(1, "auto"))


def test_a_repeated_auto_request_is_the_same_split_whichever_split_auto_chose() -> None:
    """An `auto` placement that chose tensor is what a repeated `auto` request asks for (the master then answers
    the instance placed instead of placing it anew), as is `tensor` asked by name; `pipeline` is not."""
    measured = nodes_measured(4, NODE_A, NODE_B, bandwidth_gb_s=10, round_trip_ms=0.1)
    placed = place(measured, place_request(2, "auto"))
    assert placed.parallel == "tensor"
    assert placed.parallel_asked == "auto"
    assert same_split_asked(placed, place_request(2, "auto"))
    assert same_split_asked(placed, place_request(2, "tensor"))
    assert not same_split_asked(placed, place_request(2, "pipeline"))
    # An instance kept from before the choice was recorded counts as auto's when it is a pipeline.
    legacy = placed.model_copy(update={"parallel_asked": None})
    assert not same_split_asked(legacy, place_request(2, "auto"))
    assert same_split_asked(legacy.model_copy(update={"parallel": "pipeline"}), place_request(2, "auto"))
