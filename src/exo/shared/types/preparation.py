"""Progress of getting a model ready to load (download, GGUF assembly, conversion): shown in /state."""

from typing import Literal

from exo.shared.types.common import FrozenModel, ModelId

WorkPhase = Literal["downloading", "assembling", "converting"]
"""A long step with a byte count: fetching pieces, joining and checking them into one GGUF, converting tensors."""

PreparationPhase = WorkPhase | Literal["ready", "failed"]


class ProgressUpdate(FrozenModel):
    """What a long step reports as it goes: its phase and how many of its bytes are done."""

    phase: WorkPhase
    done_bytes: int
    total_bytes: int


class ModelPreparation(FrozenModel):
    """Where one model's preparation stands; rate and time left are for the current phase."""

    model_id: ModelId
    phase: PreparationPhase
    done_bytes: int
    total_bytes: int
    bytes_per_second: float | None = None
    seconds_left: float | None = None
    # Wall-clock seconds since the epoch.
    started_at: float
    updated_at: float
    error: str | None = None
