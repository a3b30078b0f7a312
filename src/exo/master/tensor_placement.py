"""Placing one model split by its matrices (tensor parallel): every rank runs every layer with 1/N of its attention
heads, KV heads and MLP columns, and holds the weights outside the layers whole.

The model goes on the smallest number of nodes (at least `min_nodes`) that each hold one rank's share, the nodes with
the most free memory first (rank 0, which chooses the tokens, on the one with most). Every rank's share is the same,
so the node with the least free memory of those chosen decides. A number of nodes that the model's head counts or
MLP width do not divide is skipped; when it is the number asked for, the placement is refused naming the counts.
"""

from collections.abc import Sequence
from typing import Final

from exo.master.pipeline_placement import (
    RUNTIME_OVERHEAD_BYTES,
    RUNTIME_OVERHEAD_FRACTION,
    NodeCapacity,
    PipelinePlan,
    PlacementError,
)
from exo.shared.types.footprint import ModelFootprint, WeightsInMemory

_GIB: Final = 1024**3


class IndivisibleHeadsError(PlacementError):
    """A tensor split over the nodes asked for cannot give every rank the same heads; the message names the counts."""


def tensor_rank_need(footprint: ModelFootprint, world_size: int, *, weights: WeightsInMemory) -> int:
    """Memory one rank of a tensor split over `world_size` nodes is planned to use: its share plus room to serve."""
    held = footprint.tensor_rank_bytes(world_size, weights=weights)
    return int(held * (1 + RUNTIME_OVERHEAD_FRACTION)) + RUNTIME_OVERHEAD_BYTES


def plan_tensor(
    model: str, footprint: ModelFootprint, nodes: Sequence[NodeCapacity], *, min_nodes: int = 1
) -> PipelinePlan:
    """The smallest tensor split of `model` over `nodes` (at least `min_nodes`); raises PlacementError, or
    IndivisibleHeadsError when `min_nodes` does not divide the model's heads."""
    ranked = sorted(nodes, key=lambda node: (-node.available_bytes, node.node_id))
    smallest = max(min_nodes, 1)
    if smallest > len(ranked):
        raise PlacementError(f"model {model} is to be split over {smallest} nodes but only {len(ranked)} are up")
    for size in range(smallest, len(ranked) + 1):
        refusal = footprint.tensor_split_refusal(size) if size > 1 else None
        if refusal is not None:
            if size == smallest:
                raise IndivisibleHeadsError(
                    f"model {model} cannot be split by tensor parallel over {size} nodes: {refusal}"
                )
            continue
        chosen = ranked[:size]
        needs = [tensor_rank_need(footprint, size, weights=node.weights) for node in chosen]
        if all(need <= node.available_bytes for need, node in zip(needs, chosen, strict=True)):
            return PipelinePlan(
                node_ids=tuple(node.node_id for node in chosen),
                layer_counts=(footprint.num_layers,) * size,
                planned_bytes=tuple(needs),
            )
    available = ", ".join(f"{node.node_id} {node.available_bytes / _GIB:.2f} GiB" for node in ranked) or "no nodes"
    whole = tensor_rank_need(footprint, 1, weights=ranked[0].weights if ranked else "float32")
    raise PlacementError(
        f"model {model} does not fit split by tensor parallel over at least {smallest} nodes: it needs "
        f"{whole / _GIB:.2f} GiB on one node, and on each of N nodes its shared weights plus 1/N of its layers; "
        f"available: {available}"
    )
