"""A call parsed whole (by `ast`, or a held JSON list): a name and its arguments object."""

from pydantic import BaseModel, ConfigDict
from pydantic import JsonValue as WireJsonValue


class ParsedCall(BaseModel):
    """One complete call: a name and its arguments object."""

    model_config = ConfigDict(frozen=True)

    name: str
    arguments: dict[str, WireJsonValue]
