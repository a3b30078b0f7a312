"""What the bench says to its raw mlx-lm workers and what they answer, one JSON object a line. Imports nothing of
exo's engine: the stock worker uses it and must never load exo's replacements."""

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field, TypeAdapter


class RawSetup(BaseModel):
    model_path: Path
    float32_copy: Path
    """The replacements worker writes the float32 weights it loaded here; the stock worker loads them from here."""


class RawReady(BaseModel):
    dtype: str
    matmul_gflops: float | None
    """Float32 matmul speed under this process's BLAS (exo's self-check: the stock worker, which must not import
    exo's engine, leaves it out): shows whether the preload took effect."""
    loaded: str
    """How the worker loaded the model, for the report's label."""
    exo_engine_imported: bool
    """Whether any module of exo's engine (`exo.worker`) is loaded in the worker: must be False for the stock one."""


class RawRequest(BaseModel):
    kind: Literal["generate"] = "generate"
    tag: str
    max_tokens: int


class PassCostRequest(BaseModel):
    """Time one decode step (a forward pass and the greedy pick) over each number of sequences in `rows`."""

    kind: Literal["pass_costs"] = "pass_costs"
    rows: list[int]
    repeats: int
    planned: bool = False
    """Time the steps on a second copy of the model with exo's matmul plan installed, as exo's runner has it."""


class PassCosts(BaseModel):
    seconds: dict[int, float]
    """Best time of a decode step over that many sequences, each one token past the decode prompt."""


REQUESTS: TypeAdapter[RawRequest | PassCostRequest] = TypeAdapter(
    Annotated[RawRequest | PassCostRequest, Field(discriminator="kind")]
)
