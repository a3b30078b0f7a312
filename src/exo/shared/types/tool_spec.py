"""A tool the model may call, as the engine takes it whichever dialect it came in: each dialect's request adapter
turns its wire tool (OpenAI's and Ollama's `function`, Anthropic's tool, a Responses function tool) into this."""

from pydantic import BaseModel, ConfigDict, Field

from exo.shared.types.api import JsonObject


class ToolSpec(BaseModel):
    # Keys a client added to its function beyond these are kept: the prompt shows the model the tool as it was sent.
    model_config = ConfigDict(frozen=True, extra="allow")

    name: str
    description: str | None = None
    parameters: JsonObject = Field(default_factory=lambda: {"type": "object", "properties": {}})
    """The JSON Schema of the call's arguments."""
    strict: bool | None = None
    """The client asked that calls match `parameters` exactly (a server-side control, never shown to the model)."""
