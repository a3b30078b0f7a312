"""Which part of a model a runner holds. World size 1 today; the cluster splits layers across ranks later."""

from pydantic import model_validator

from exo.shared.types.common import FrozenModel


class ShardAssignment(FrozenModel):
    rank: int = 0
    world_size: int = 1
    start_layer: int = 0
    # Exclusive end; None means "through the last layer" (resolved once the model config is read).
    end_layer: int | None = None

    @model_validator(mode="after")
    def _check(self) -> "ShardAssignment":
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside world size {self.world_size}")
        if self.end_layer is not None and self.end_layer <= self.start_layer:
            raise ValueError("end_layer must be greater than start_layer")
        return self

    @property
    def is_emitter(self) -> bool:
        """Only rank 0 parses tool calls and streams chunks back; other ranks just compute."""
        return self.rank == 0
