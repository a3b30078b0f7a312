"""Placing one model over the nodes of a cluster by memory: a pure function of the nodes' free memory and the
model's footprint, so it is tested without processes.

The model goes on the smallest set of nodes (at least `min_nodes`) whose available memory holds it, trying the
nodes with the most free memory first. Layers are split in proportion to each chosen node's free memory, at least one
each; every rank also holds the shared weights (embeddings, final norm, output head). A model that fits nowhere is
refused with the memory it needs and the memory there is: never a half-placed instance.
"""

from collections.abc import Sequence
from typing import Final

from exo.shared.types.common import FrozenModel, NodeId
from exo.shared.types.footprint import ModelFootprint, WeightsInMemory

# What a rank needs beyond its weights while it serves: its KV cache and activations grow with the context.
RUNTIME_OVERHEAD_FRACTION: Final = 0.10
RUNTIME_OVERHEAD_BYTES: Final = 256 * 1024 * 1024
_GIB: Final = 1024**3
# Largest first: a refusal names the smallest need among the nodes (the last of these any of them has).
# (`gguf_or_q8_0` is resolved for the model first: `ModelFootprint.held_as`.)
_HELD_ORDER: Final[tuple[WeightsInMemory, ...]] = ("float32", "q8_0", "gguf_or_q8_0", "int8", "stored", "gguf")


class NodeCapacity(FrozenModel):
    node_id: NodeId
    available_bytes: int
    # How this node's runners hold the weights (a CPU node under `--cpu-kernels auto` converts every checkpoint to
    # float32, or to int8 / Q8_0 / the GGUF's blocks under `--cpu-weights int8` / `q8_0` / `gguf`, or under `auto`
    # with ggml found to the GGUF the model kept, else Q8_0; NodeFacts.weights_in_memory).
    weights: WeightsInMemory = "float32"


class PipelinePlan(FrozenModel):
    """Which node runs each rank (rank 0 first: it runs the last layers) and how many layers each runs."""

    node_ids: tuple[NodeId, ...]
    layer_counts: tuple[int, ...]
    # Memory each rank is planned to use, in the same order.
    planned_bytes: tuple[int, ...]


class PlacementError(ValueError):
    """The model cannot be placed; the message names the memory needed and the memory available."""


def rank_need(footprint: ModelFootprint, start: int, end: int, *, weights: WeightsInMemory) -> int:
    """Memory a rank running layers [start, end) is planned to use: its weights plus room to serve."""
    held = footprint.rank_bytes(start, end, weights=weights)
    return int(held * (1 + RUNTIME_OVERHEAD_FRACTION)) + RUNTIME_OVERHEAD_BYTES


def split_layers_by_memory(num_layers: int, available: Sequence[int]) -> tuple[int, ...]:
    """`num_layers` split in proportion to `available` (largest remainders), at least one layer each."""
    if not 0 < len(available) <= num_layers:
        raise ValueError(f"cannot give {len(available)} ranks at least one of {num_layers} layers")
    weights = [max(amount, 1) for amount in available]
    total = sum(weights)
    exact = [num_layers * weight / total for weight in weights]
    counts = [max(int(share), 1) for share in exact]
    by_remainder = sorted(range(len(counts)), key=lambda rank: (counts[rank] - exact[rank], rank))
    while sum(counts) < num_layers:
        counts[by_remainder.pop(0)] += 1
    while sum(counts) > num_layers:  # ranks raised to one layer took it from the others
        spare = [rank for rank in range(len(counts)) if counts[rank] > 1]
        rank = max(spare, key=lambda candidate: (counts[candidate] - exact[candidate], -candidate))
        counts[rank] -= 1
    return tuple(counts)


def plan_pipeline(
    model: str, footprint: ModelFootprint, nodes: Sequence[NodeCapacity], *, min_nodes: int = 1
) -> PipelinePlan:
    """The smallest placement of `model` over `nodes` (at least `min_nodes` of them); raises PlacementError."""
    ranked = sorted(nodes, key=lambda node: (-node.available_bytes, node.node_id))
    layers = footprint.num_layers
    if min_nodes > layers:
        raise PlacementError(f"model {model} has {layers} layers: it cannot be split over {min_nodes} nodes")
    if min_nodes > len(ranked):
        raise PlacementError(f"model {model} is to be split over {min_nodes} nodes but only {len(ranked)} are up")
    for size in range(max(min_nodes, 1), min(len(ranked), layers) + 1):
        plan = _fit(footprint, ranked[:size])
        if plan is not None:
            return plan
    return _refuse(model, footprint, ranked, min_nodes)


def _fit(footprint: ModelFootprint, chosen: Sequence[NodeCapacity]) -> PipelinePlan | None:
    counts = split_layers_by_memory(footprint.num_layers, [node.available_bytes for node in chosen])
    needs: list[int] = []
    for rank, node in enumerate(chosen):
        start = sum(counts[rank + 1 :])
        need = rank_need(footprint, start, start + counts[rank], weights=node.weights)
        if need > node.available_bytes:
            return None
        needs.append(need)
    return PipelinePlan(
        node_ids=tuple(node.node_id for node in chosen), layer_counts=counts, planned_bytes=tuple(needs)
    )


def _refuse(model: str, footprint: ModelFootprint, ranked: Sequence[NodeCapacity], min_nodes: int) -> PipelinePlan:
    # The smallest need any of them has (float32 only where every node holds weights so).
    held: list[WeightsInMemory] = [footprint.held_as(node.weights) for node in ranked]
    weights = max(held, key=_HELD_ORDER.index) if held else "float32"
    whole = rank_need(footprint, 0, footprint.num_layers, weights=weights)
    shared = rank_need(footprint, 0, 0, weights=weights)
    available = ", ".join(f"{node.node_id} {node.available_bytes / _GIB:.2f} GiB" for node in ranked) or "no nodes"
    over = f" over at least {min_nodes} nodes" if min_nodes > 1 else ""
    held_as = "as the checkpoint stores them" if weights == "stored" else f"as {weights}"
    smaller = ""
    if weights == "float32":
        int8 = rank_need(footprint, 0, footprint.num_layers, weights="int8")
        smaller = f"; held as int8 (`--cpu-weights int8` on a Linux CPU) it would need {int8 / _GIB:.2f} GiB"
    raise PlacementError(
        f"model {model} does not fit{over}: it needs {whole / _GIB:.2f} GiB in all with its weights held "
        f"{held_as} ({shared / _GIB:.2f} GiB on each node it is split over, plus its "
        f"{footprint.num_layers} layers); available: {available}{smaller}"
    )
