"""The figures `auto` weighs (master/split_choice.py), from what the nodes measured and published in their facts:
each node's memory bandwidth (cluster/memory_bandwidth.py) and the round trip and bandwidth between each pair of them
(cluster/link_probe.py).

Compute per token is, where a runner on the rank's node serves the same model whole and has timed enough decode steps
with one request decoding (its host-overhead meter, `step_times` in /state), that step's mean time scaled by the
share of the whole model's bytes the rank would hold: a measured step, which counts what reading the weights does
not (kernels, Python) but scales that too, so it still flatters a split a little. Elsewhere it is the bytes a rank
reads per token over its node's memory bandwidth, times how many times that estimate the timed nodes' steps took
(their mean; so a node that timed nothing is not made to look cheap beside one that did), or as it is where no node
timed a step of the model: decoding reads every
weight once a token, so a rank's held weights are what it reads (the weights outside the layers counted whole: the
output head is read whole, the embedding table only one row, so this overstates every candidate by the same
embedding bytes). Ranks of a pipeline run one after another, so their times add up; ranks of a tensor split run
at once, so the slowest decides. What a step costs beyond reading weights (launching kernels, Python) is not
counted: it is not divided by a split, so leaving it out favours neither a pipeline nor one node, and flatters a
tensor split, whose every rank runs every layer's kernels.
"""

from collections.abc import Sequence
from typing import Final

from exo.master.pipeline_placement import PipelinePlan
from exo.master.split_choice import (
    PIPELINE_ROUND_TRIPS_PER_TOKEN,
    SplitEstimate,
    pipeline_transfer_bytes,
    tensor_round_trips_per_token,
    tensor_transfer_bytes,
)
from exo.shared.types.common import ModelId, NodeId
from exo.shared.types.footprint import ModelFootprint
from exo.shared.types.links import LinkMeasurement
from exo.shared.types.state import State
from exo.shared.types.worker.shards import Parallelism

MIN_TIMED_STEPS: Final = 16
"""Decode steps with one request decoding a runner must have timed before their mean stands for its node's compute
(a runner's first steps include warming up)."""


def timed_step_seconds(state: State, node_id: NodeId, model_id: ModelId) -> float | None:
    """The mean decode step, one request decoding, of a runner on `node_id` that serves `model_id` whole (the
    fastest, where several do; prompt pieces fed in those steps left out), or None where none has timed
    MIN_TIMED_STEPS."""
    steps = [
        (times.step_seconds - times.prefill_seconds) / times.steps
        for runner in state.runners.values()
        if runner.node_id == node_id and runner.model_id == model_id and runner.shard.world_size == 1
        if (times := runner.step_times.get(1)) is not None and times.steps >= MIN_TIMED_STEPS
    ]
    return min(steps, default=None)


def step_over_bytes(state: State, footprint: ModelFootprint, model_id: ModelId) -> float | None:
    """How many times its bytes over memory bandwidth a decode step of `model_id` took on the nodes that timed one
    (their mean), or None where none did."""
    ratios: list[float] = []
    for node_id, node in state.nodes.items():
        step = timed_step_seconds(state, node_id, model_id)
        bandwidth = node.facts.memory_bandwidth_bytes_per_second
        if step is not None and bandwidth is not None and bandwidth > 0:
            whole = footprint.rank_bytes(0, footprint.num_layers, weights=node.facts.weights_in_memory)
            ratios.append(step * bandwidth / whole)
    return sum(ratios) / len(ratios) if ratios else None


def _measured_both_ways(state: State, first: NodeId, second: NodeId) -> list[LinkMeasurement]:
    """What each of the two nodes measured of their link (none, one or both)."""
    return [
        link
        for node, peer in ((first, second), (second, first))
        if node in state.nodes and (link := state.nodes[node].facts.links.get(peer)) is not None
    ]


def settling_nodes(state: State, nodes: Sequence[NodeId]) -> frozenset[NodeId]:
    """The nodes among `nodes` with a link to another of them still settling (measured only just after a join,
    cluster/link_probe.py: a better figure is seconds away)."""
    return frozenset(
        node
        for index, first in enumerate(nodes)
        for second in nodes[index + 1 :]
        if any(link.settling for link in _measured_both_ways(state, first, second))
        for node in (first, second)
    )


def pair_round_trip_ms(state: State, first: NodeId, second: NodeId) -> float | None:
    """The slower of the two nodes' measurements of their link (either one when only one measured it)."""
    measured = [link.round_trip_ms for link in _measured_both_ways(state, first, second)]
    return max(measured) if measured else None


def pair_bandwidth(state: State, first: NodeId, second: NodeId) -> float | None:
    """The slower of the two nodes' bandwidth figures for their link (either one when only one measured it)."""
    measured = [
        link.bandwidth_bytes_per_second
        for link in _measured_both_ways(state, first, second)
        if link.bandwidth_bytes_per_second is not None
    ]
    return min(measured) if measured else None


def split_bandwidth(state: State, nodes: Sequence[NodeId]) -> float | None:
    """The slowest pair's bandwidth among `nodes` (None where any pair has no figure)."""
    figures = [
        pair_bandwidth(state, first, second) for index, first in enumerate(nodes) for second in nodes[index + 1 :]
    ]
    if not figures or any(figure is None for figure in figures):
        return None
    return min(figure for figure in figures if figure is not None)


def split_estimate(
    state: State,
    footprint: ModelFootprint,
    parallel: Parallelism,
    plan: PipelinePlan,
    model_id: ModelId | None = None,
) -> SplitEstimate:
    """The estimated time per token of `plan` (a pipeline's, or a tensor split's when `parallel` says so), its
    compute from a decode step of `model_id` timed on a rank's node where there is one."""
    nodes = plan.node_ids
    size = len(nodes)
    missing: list[str] = []
    rank_seconds: list[float] = []
    timed_ranks = 0
    scale = None if model_id is None else step_over_bytes(state, footprint, model_id)
    for rank, node_id in enumerate(nodes):
        facts = state.nodes[node_id].facts
        if parallel == "tensor" and size > 1:
            read = footprint.tensor_rank_bytes(size, weights=facts.weights_in_memory)
        else:
            start = sum(plan.layer_counts[rank + 1 :])
            read = footprint.rank_bytes(start, start + plan.layer_counts[rank], weights=facts.weights_in_memory)
            if rank > 0:  # the weights outside the layers are read once a token, not on every rank
                read -= footprint.rank_bytes(0, 0, weights=facts.weights_in_memory)
        step = None if model_id is None else timed_step_seconds(state, node_id, model_id)
        bandwidth = facts.memory_bandwidth_bytes_per_second
        if step is not None:
            timed_ranks += 1
            rank_seconds.append(
                step * read / footprint.rank_bytes(0, footprint.num_layers, weights=facts.weights_in_memory)
            )
        elif bandwidth is None or bandwidth <= 0:
            missing.append(f"the memory bandwidth of {node_id}")
        else:
            rank_seconds.append(read / bandwidth * (scale or 1.0))
    compute = None
    if not missing:
        compute = 1000 * (max(rank_seconds) if parallel == "tensor" else sum(rank_seconds))
    trips: list[float] = []
    for index, first in enumerate(nodes):
        for second in nodes[index + 1 :]:
            trip = pair_round_trip_ms(state, first, second)
            if trip is None:
                missing.append(f"the round trip between {first} and {second}")
            else:
                trips.append(trip)
    exchanges = 0
    if size > 1:
        exchanges = (
            tensor_round_trips_per_token(footprint.num_layers)
            if parallel == "tensor"
            else PIPELINE_ROUND_TRIPS_PER_TOKEN
        )
    hidden = footprint.hidden_size
    transfer = 0
    if size > 1:
        if hidden is None:
            transfer = None
        elif parallel == "tensor":
            transfer = tensor_transfer_bytes(footprint.num_layers, hidden, size)
        else:
            transfer = pipeline_transfer_bytes(hidden, size)
    return SplitEstimate(
        parallel=parallel,
        world_size=size,
        compute_ms=compute,
        timed_ranks=timed_ranks,
        untimed_scale=scale if timed_ranks < size else None,
        exchanges=exchanges,
        round_trip_ms=None if len(trips) < size * (size - 1) // 2 else max(trips, default=0.0),
        transfer_bytes=transfer,
        bandwidth_bytes_per_second=split_bandwidth(state, nodes) if size > 1 else None,
        missing=tuple(missing),
    )


def estimates_of(
    state: State,
    footprint: ModelFootprint,
    plans: Sequence[tuple[Parallelism, PipelinePlan]],
    model_id: ModelId | None = None,
) -> list[SplitEstimate]:
    return [split_estimate(state, footprint, parallel, plan, model_id) for parallel, plan in plans]
