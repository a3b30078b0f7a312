"""Which part of a model a runner holds: the whole model (world size 1), one rank's layers of a pipeline, or one
rank's slice of every layer's matrices (tensor parallel).

In a pipeline, rank 0 runs the *last* layers (mlx-lm's convention): it ends each step holding the logits, so it is
the rank that chooses tokens, parses tool calls and streams chunks. In a tensor split every rank runs every layer
with 1/N of its attention heads and MLP columns; rank 0 likewise chooses the tokens and streams.
"""

from typing import Literal

from pydantic import model_validator

from exo.shared.types.common import FrozenModel

# How a model was split: by mlx-lm's own pipeline support, by exo's layer-range wrapper, or by mlx-lm's `shard`
# (tensor parallel).
PipelineStrategy = Literal["mlx-lm", "layer-range", "tensor"]

Parallelism = Literal["pipeline", "tensor"]
"""How an instance over several nodes splits its model: by layers (pipeline) or by matrices (tensor)."""

ParallelChoice = Literal["pipeline", "tensor", "auto"]
"""What a placement asks for; `auto` is resolved by the master's rule (master/split_choice.py)."""


class PipelinePeers(FrozenModel):
    """How the ranks of one pipeline instance reach each other; every tuple is indexed by rank."""

    # "ip:port" of each rank's mlx.distributed ring endpoint (the hostfile the ring backend reads).
    ring_addresses: tuple[str, ...]
    # "ip:port" where rank 0 hands each task to the other ranks (idle ranks wait there, not on the ring).
    task_address: str
    # How many layers each rank runs; in a pipeline rank 0 runs the last `layer_counts[0]` layers, in a tensor split
    # every rank runs all of them (every count is the model's layer count).
    layer_counts: tuple[int, ...]
    parallel: Parallelism = "pipeline"

    @model_validator(mode="after")
    def _check(self) -> "PipelinePeers":
        if len(self.ring_addresses) != len(self.layer_counts) or len(self.layer_counts) < 2:
            raise ValueError("a pipeline needs one ring address and one layer count per rank, and at least 2 ranks")
        if any(count < 1 for count in self.layer_counts):
            raise ValueError(f"every rank needs at least one layer, got {self.layer_counts}")
        if self.parallel == "tensor" and len(set(self.layer_counts)) != 1:
            raise ValueError(f"every rank of a tensor split runs every layer, got {self.layer_counts}")
        return self

    @property
    def num_layers(self) -> int:
        return self.layer_counts[0] if self.parallel == "tensor" else sum(self.layer_counts)

    def layer_range(self, rank: int) -> tuple[int, int]:
        """The [start, end) layers of `rank`: in a pipeline the ranks after it run the layers before it; in a tensor
        split every rank runs them all."""
        if self.parallel == "tensor":
            return 0, self.layer_counts[rank]
        start = sum(self.layer_counts[rank + 1 :])
        return start, start + self.layer_counts[rank]


class ShardAssignment(FrozenModel):
    rank: int = 0
    world_size: int = 1
    start_layer: int = 0
    # Exclusive end; None means "through the last layer" (resolved once the model config is read).
    end_layer: int | None = None
    # The other ranks of this pipeline; None for a whole model on one runner.
    peers: PipelinePeers | None = None

    @model_validator(mode="after")
    def _check(self) -> "ShardAssignment":
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside world size {self.world_size}")
        if self.end_layer is not None and self.end_layer <= self.start_layer:
            raise ValueError("end_layer must be greater than start_layer")
        if (self.peers is None) != (self.world_size == 1):
            raise ValueError("a shard of a pipeline (world size > 1) needs its peers, a whole model needs none")
        if self.peers is not None:
            if len(self.peers.layer_counts) != self.world_size:
                raise ValueError(f"{len(self.peers.layer_counts)} layer counts for world size {self.world_size}")
            if (self.start_layer, self.end_layer) != self.peers.layer_range(self.rank):
                raise ValueError(f"layers {self.start_layer}..{self.end_layer} are not rank {self.rank}'s share")
        return self

    @property
    def is_tensor(self) -> bool:
        """This rank holds a slice of every layer's matrices (a tensor split), not a range of whole layers."""
        return self.peers is not None and self.peers.parallel == "tensor"

    @property
    def is_emitter(self) -> bool:
        """Only rank 0 parses tool calls and streams chunks back; other ranks just compute."""
        return self.rank == 0


def pipeline_shards(peers: PipelinePeers) -> tuple[ShardAssignment, ...]:
    """One assignment per rank of the pipeline `peers` describes."""
    shards: list[ShardAssignment] = []
    for rank in range(len(peers.layer_counts)):
        start, end = peers.layer_range(rank)
        shards.append(
            ShardAssignment(
                rank=rank, world_size=len(peers.layer_counts), start_layer=start, end_layer=end, peers=peers
            )
        )
    return tuple(shards)
