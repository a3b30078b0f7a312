"""What a model's weights take in memory, layer by layer: what placement plans a pipeline with."""

from pydantic import model_validator

from exo.shared.types.common import FrozenModel


class ModelFootprint(FrozenModel):
    """Parameter counts and checkpoint bytes, per layer and for the weights outside any layer.

    Every pipeline rank holds the shared weights (embeddings, final norm, output head) and its own layers.
    """

    layer_parameters: tuple[int, ...]
    shared_parameters: int
    layer_file_bytes: tuple[int, ...]
    shared_file_bytes: int

    @model_validator(mode="after")
    def _check(self) -> "ModelFootprint":
        if len(self.layer_parameters) != len(self.layer_file_bytes) or not self.layer_parameters:
            raise ValueError("a footprint needs parameter and byte counts for every layer, and at least one layer")
        return self

    @property
    def num_layers(self) -> int:
        return len(self.layer_parameters)

    def rank_bytes(self, start: int, end: int, *, float32: bool) -> int:
        """Memory for the shared weights plus layers [start, end): at 4 bytes a parameter where the runtime
        converts weights to float32 (Linux CPU), else as stored."""
        if float32:
            return 4 * (self.shared_parameters + sum(self.layer_parameters[start:end]))
        return self.shared_file_bytes + sum(self.layer_file_bytes[start:end])

    def total_bytes(self, *, float32: bool) -> int:
        return self.rank_bytes(0, self.num_layers, float32=float32)
