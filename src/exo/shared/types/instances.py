"""Instances the master placed over several nodes: which node runs each rank of a model, with which layers.

An instance is recorded in the state when the master places it and removed when one of its nodes leaves; every node
starts (and stops) its own ranks from what the state says, so placement needs no second channel.
"""

from typing import Literal

from pydantic import Field, TypeAdapter

from exo.shared.types.common import CommandId, FrozenModel, InstanceId, ModelId, NodeId
from exo.shared.types.footprint import ModelFootprint
from exo.shared.types.worker.shards import (
    ParallelChoice,
    Parallelism,
    PipelinePeers,
    ShardAssignment,
    pipeline_shards,
)


class RankPlacement(FrozenModel):
    rank: int
    node_id: NodeId
    # In a tensor split every rank runs every layer: 0 to the layer count.
    start_layer: int
    end_layer: int
    # Memory placement planned for this rank (its weights plus room to serve).
    planned_bytes: int


class PlacedInstance(FrozenModel):
    """One copy of a model placed by memory; rank 0 runs the last layers (a pipeline) or 1/N of every layer (a tensor
    split), chooses tokens and streams the answers."""

    instance_id: InstanceId
    model_id: ModelId
    min_nodes: int
    # How the model is split over the ranks (pipeline also for a model on one node).
    parallel: Parallelism = "pipeline"
    # Why this split: asked for, or the `auto` rule's reason (master/split_choice.py); None from before it was kept.
    parallel_reason: str | None = None
    # What the placement request asked for (`auto` or a split), so that a repeated request is recognised as one
    # whatever split `auto` chose; None from before it was kept.
    parallel_asked: ParallelChoice | None = None
    # The node holding the whole checkpoint: the others copy their layers' files from it.
    files_from: NodeId
    footprint: ModelFootprint
    ranks: tuple[RankPlacement, ...]
    # The ranks' ring and task addresses; None when the model fits on one node (no pipeline).
    peers: PipelinePeers | None
    placed_at: float
    # Why it runs on fewer nodes than `min_nodes` asks (too few were up); None when it has the spread asked for.
    degraded_reason: str | None = None
    # The degraded instance this one takes over from once it is ready and the old one has finished its tasks.
    replaces: InstanceId | None = None

    def shard(self, rank: int) -> ShardAssignment:
        return ShardAssignment() if self.peers is None else pipeline_shards(self.peers)[rank]

    def ranks_on(self, node_id: NodeId) -> tuple[RankPlacement, ...]:
        return tuple(placement for placement in self.ranks if placement.node_id == node_id)


class PlaceInstance(FrozenModel):
    """API node → master: place `model_id` (whose files `files_from` holds) over at least `min_nodes` nodes."""

    kind: Literal["place_instance"] = "place_instance"
    request_id: CommandId
    model_id: ModelId
    min_nodes: int = Field(ge=1)
    footprint: ModelFootprint
    files_from: NodeId
    # Split by layers, by matrices, or as the master chooses (`auto`).
    parallel: ParallelChoice = "auto"
    # Availability first: with fewer than `min_nodes` nodes up, place it over the nodes that are (degraded).
    allow_fewer: bool = False
    # The asking node keeps asking until it is placed: a refusal is recorded in the state, so requests for the model
    # get a 503 saying why instead of a 404 (a one-off request from the API is refused to its caller only).
    kept: bool = False


class PendingPlacement(FrozenModel):
    """A model the cluster keeps placed but cannot serve right now, and why: requests for it get a 503, not a 404."""

    model_id: ModelId
    files_from: NodeId
    min_nodes: int
    reason: str
    since: float


PlacementRefusal = Literal["insufficient_memory", "indivisible_heads"]
"""Why a placement was refused: the model fits nowhere, or its heads do not divide over the nodes of a tensor split."""


class InstancePlacementReply(FrozenModel):
    """Master → the requesting node: the instance placed, or why it cannot be."""

    request_id: CommandId
    instance: PlacedInstance | None = None
    error: str | None = None
    refusal: PlacementRefusal = "insufficient_memory"


InstancePlacementReplyAdapter: TypeAdapter[InstancePlacementReply] = TypeAdapter(InstancePlacementReply)
