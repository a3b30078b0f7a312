"""Anthropic Messages streaming events (`event: <type>` + `data: <json>`), in the order the API sends them.

message_start, then per content block: content_block_start, content_block_delta…, content_block_stop; then
message_delta (stop reason and final usage) and message_stop. A failure mid-stream is one `error` event.
"""

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from exo.api.types.anthropic_messages import (
    AnthropicErrorBody,
    AnthropicMessage,
    StopReason,
    TextContent,
    ThinkingContent,
    ToolUseContent,
)


class MessageStartEvent(BaseModel):
    type: Literal["message_start"] = "message_start"
    message: AnthropicMessage


class ContentBlockStartEvent(BaseModel):
    type: Literal["content_block_start"] = "content_block_start"
    index: int
    content_block: Annotated[TextContent | ThinkingContent | ToolUseContent, Field(discriminator="type")]


class TextDelta(BaseModel):
    type: Literal["text_delta"] = "text_delta"
    text: str


class ThinkingDelta(BaseModel):
    type: Literal["thinking_delta"] = "thinking_delta"
    thinking: str


class InputJsonDelta(BaseModel):
    """A fragment of a tool_use block's input JSON; the fragments concatenate to the whole input."""

    type: Literal["input_json_delta"] = "input_json_delta"
    partial_json: str


class ContentBlockDeltaEvent(BaseModel):
    type: Literal["content_block_delta"] = "content_block_delta"
    index: int
    delta: Annotated[TextDelta | ThinkingDelta | InputJsonDelta, Field(discriminator="type")]


class ContentBlockStopEvent(BaseModel):
    type: Literal["content_block_stop"] = "content_block_stop"
    index: int


class MessageDeltaBody(BaseModel):
    stop_reason: StopReason
    stop_sequence: str | None


class MessageDeltaUsage(BaseModel):
    """Cumulative totals; the prompt counts are known only at the end, so they arrive here, not in message_start."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    # exo's own: how many calls the agent-loop guard withdrew from this answer (docs/TOOL_CALLING.md); absent at 0.
    withdrawn_tool_calls: int = Field(default=0, exclude_if=lambda count: count == 0)


class MessageDeltaEvent(BaseModel):
    type: Literal["message_delta"] = "message_delta"
    delta: MessageDeltaBody
    usage: MessageDeltaUsage
    # exo's own: what the agent-loop guard found (docs/TOOL_CALLING.md); absent when it found nothing.
    exo_loop_warnings: list[str] | None = Field(default=None, exclude_if=lambda warnings: not warnings)


class MessageStopEvent(BaseModel):
    type: Literal["message_stop"] = "message_stop"


class ErrorEvent(BaseModel):
    type: Literal["error"] = "error"
    error: AnthropicErrorBody


MessageStreamEvent = (
    MessageStartEvent
    | ContentBlockStartEvent
    | ContentBlockDeltaEvent
    | ContentBlockStopEvent
    | MessageDeltaEvent
    | MessageStopEvent
    | ErrorEvent
)
