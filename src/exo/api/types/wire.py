"""What every dialect's request models build on: a strict base that keeps unknown fields, and the scalar types
(integers that JSON writes as 2.0, seeds, stop sequences) their fields share."""

from typing import Annotated, Final

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

from exo.shared.types.api import MAX_SEED


def _whole_float_to_int(value: object) -> object:
    # JSON Schema counts 2.0 as an integer, strict pydantic does not; strings stay rejected.
    return int(value) if isinstance(value, float) and value.is_integer() else value


Integer = Annotated[int, BeforeValidator(_whole_float_to_int)]


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
