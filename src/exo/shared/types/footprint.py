"""What a model's weights take in memory, layer by layer: what placement plans a pipeline with."""

from typing import Literal

from pydantic import model_validator

from exo.shared.types.common import FrozenModel

WeightsInMemory = Literal["stored", "float32", "int8"]
"""How a runner holds the weights: as the checkpoint stores them, expanded to float32 (a Linux CPU's float32
engine), or as int8 with per-row scales (`--cpu-weights int8`)."""

INT8_OVERHEAD = 1 / 32
"""Beyond one byte a parameter: each matrix's float32 scale per output row (4 bytes per row of at least 128 weights
in any real model) and the norms and biases kept in float32."""


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

    def rank_bytes(self, start: int, end: int, *, weights: WeightsInMemory) -> int:
        """Memory for the shared weights plus layers [start, end): 4 bytes a parameter where the runtime converts
        weights to float32 (Linux CPU), about one where it holds them as int8, else as stored."""
        parameters = self.shared_parameters + sum(self.layer_parameters[start:end])
        if weights == "float32":
            return 4 * parameters
        if weights == "int8":
            return int(parameters * (1 + INT8_OVERHEAD))
        return self.shared_file_bytes + sum(self.layer_file_bytes[start:end])

    def total_bytes(self, *, weights: WeightsInMemory) -> int:
        return self.rank_bytes(0, self.num_layers, weights=weights)
