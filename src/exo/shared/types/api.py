"""What the layers under the API share of its wire: the JSON object type, the seed range the engine takes, and
the error envelope and model list that every route answers with and clients (`exo launch`, the MCP tools) read.
Each dialect's own wire types are in exo.api.types."""

from typing import Any, Final, Literal

from pydantic import BaseModel, Field

from exo.shared.types.preparation import ModelPreparation
from exo.shared.types.runner_status import RunnerStatus

JsonObject = dict[str, Any]

# mlx seeds its generator with an unsigned 64-bit integer.
MAX_SEED: Final = 2**64 - 1


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


# A model's card: its runner's status, or "preparing" while a node downloads, assembles or converts it (no runner yet).
ModelStatus = RunnerStatus | Literal["preparing"]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "exo"
    capabilities: list[str] = Field(default_factory=list)
    context_length: int | None = None
    # The number of tokens the model chooses from: `top_k` must be below it.
    vocab_size: int | None = None
    # How the nodes serving it hold the weights (float32 or int8 on a Linux CPU per `--cpu-weights`, else as
    # stored; None while unknown or where its ranks differ) and the memory they take over all its ranks.
    weights_in_memory: str | None = None
    memory_bytes: int | None = None
    # The runner describing it: loading, ready, running, failed (a load refused: `error` says why and what to do;
    # requests get 503 model_unavailable with the same reason) or shutdown; or preparing, before any runner, with
    # the progress in `preparation` (requests sent meanwhile wait for the model). None where nothing describes it.
    status: ModelStatus | None = None
    error: str | None = None
    preparation: ModelPreparation | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
