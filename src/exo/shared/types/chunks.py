"""What a runner streams back for one task, in order. Each chunk maps onto one OpenAI delta (or the end)."""

from typing import Annotated, Literal

from pydantic import Field, TypeAdapter

from exo.shared.types.common import FinishReason, FrozenModel, ToolCallId


class Usage(FrozenModel):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class TokenChunk(FrozenModel):
    """Plain assistant content."""

    kind: Literal["token"] = "token"
    text: str


class ReasoningChunk(FrozenModel):
    """Text inside the model's reasoning block (`<think>…</think>`): sent as `delta.reasoning_content`."""

    kind: Literal["reasoning"] = "reasoning"
    text: str


class ToolCallChunk(FrozenModel):
    """The start of tool call `index`: its id and name, known before any argument text."""

    kind: Literal["tool_call"] = "tool_call"
    index: int
    call_id: ToolCallId
    name: str


class ToolCallArgumentsChunk(FrozenModel):
    """A fragment of the JSON arguments of tool call `index`; fragments concatenate to the full arguments."""

    kind: Literal["tool_call_arguments"] = "tool_call_arguments"
    index: int
    fragment: str


class FinishChunk(FrozenModel):
    """The last chunk of a successful task."""

    kind: Literal["finish"] = "finish"
    finish_reason: FinishReason
    usage: Usage
    # The client's stop sequence that ended generation, if one did (the Messages API reports which).
    stop_sequence: str | None = None


class ErrorChunk(FrozenModel):
    """The task failed; nothing follows."""

    kind: Literal["error"] = "error"
    message: str
    error_type: str = "server_error"
    code: str | None = None
    status_code: int = 500


Chunk = Annotated[
    TokenChunk | ReasoningChunk | ToolCallChunk | ToolCallArgumentsChunk | FinishChunk | ErrorChunk,
    Field(discriminator="kind"),
]
ChunkAdapter: TypeAdapter[Chunk] = TypeAdapter(Chunk)

# What the tool parser emits while it watches generation (the runner adds Finish/Error itself).
ParsedChunk = TokenChunk | ReasoningChunk | ToolCallChunk | ToolCallArgumentsChunk
