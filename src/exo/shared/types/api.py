"""What the layers under the API share of its wire: the JSON object type; the seed range the engine takes; the
strict request-model base and scalar types the dialects' request models build on; the tool definition the
tool-call engine takes; the error envelope and model list that every route answers with and clients read. The Chat
Completions request and answer are in exo.api.types.openai_chat."""

from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

JsonObject = dict[str, Any]


def _whole_float_to_int(value: object) -> object:
    # JSON Schema counts 2.0 as an integer, strict pydantic does not; strings stay rejected.
    return int(value) if isinstance(value, float) and value.is_integer() else value


Integer = Annotated[int, BeforeValidator(_whole_float_to_int)]

# mlx seeds its generator with an unsigned 64-bit integer.
MAX_SEED: Final = 2**64 - 1


def _seed_in_range(value: int) -> int:
    # Field(le=...) would word the bound as a float (1.8446744073709552e19), which is not the bound.
    if not 0 <= value <= MAX_SEED:
        raise PydanticCustomError("seed_range", "must be between 0 and {maximum}", {"maximum": MAX_SEED})
    return value


Seed = Annotated[
    int,
    BeforeValidator(_whole_float_to_int),
    AfterValidator(_seed_in_range),
    # 2**64 is exact as a JSON (double) number, MAX_SEED is not.
    Field(json_schema_extra={"minimum": 0, "exclusiveMaximum": MAX_SEED + 1}),
]
MAX_STOP_SEQUENCES: Final = 16
# A stop sequence is matched against the tail of the output after every token; a bound keeps that cheap.
MAX_STOP_SEQUENCE_CHARACTERS: Final = 1000
StopSequence = Annotated[str, Field(max_length=MAX_STOP_SEQUENCE_CHARACTERS)]


class WireModel(BaseModel):
    """Request-side models accept unknown fields (clients send extras such as `x-` metadata) and are strict about
    the ones they declare, however deep: `"yes"` is not a boolean, `"5"` not a number (as documented)."""

    model_config = ConfigDict(extra="allow", strict=True)


class FunctionDefinition(WireModel):
    name: str
    description: str | None = None
    parameters: JsonObject = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "exo"
    capabilities: list[str] = Field(default_factory=list)
    context_length: int | None = None
    # The number of tokens the model chooses from: `top_k` must be below it.
    vocab_size: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
