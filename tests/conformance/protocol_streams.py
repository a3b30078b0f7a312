"""Messages and Responses SSE bodies for the checker tests: a good body from the real encoders, then edited."""

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio

from exo.api.adapters.messages_stream import MessageStreamEncoder
from exo.api.adapters.protocol_events import sse_body
from exo.api.adapters.responses_stream import ResponseStreamEncoder
from exo.api.types.openai_responses_output import ResponseObject
from exo.conformance.protocol_check import named_events
from exo.shared.types.chunks import (
    Chunk,
    FinishChunk,
    ReasoningChunk,
    TokenChunk,
    ToolCallArgumentsChunk,
    ToolCallChunk,
    Usage,
)
from exo.shared.types.common import ToolCallId

Event = tuple[str, dict[str, Any]]
CALL_ID = ToolCallId("call_" + "a" * 24)
# Reasoning, text, one call whose arguments arrive in two fragments: every kind of block / item.
CHUNKS: tuple[Chunk, ...] = (
    ReasoningChunk(text="Paris, then."),
    TokenChunk(text="Checking."),
    ToolCallChunk(index=0, call_id=CALL_ID, name="get_weather"),
    ToolCallArgumentsChunk(index=0, fragment='{"city": '),
    ToolCallArgumentsChunk(index=0, fragment='"Paris"}'),
    FinishChunk(finish_reason="tool_calls", usage=Usage(prompt_tokens=10, completion_tokens=6)),
)


async def _iterate(chunks: Sequence[Chunk]) -> AsyncIterator[Chunk]:
    for chunk in chunks:
        yield chunk


async def _messages_body() -> str:
    events = sse_body(MessageStreamEncoder("msg_1", "m"), CHUNKS[0], _iterate(CHUNKS[1:]))
    return "".join([event async for event in events])


async def _responses_body() -> str:
    initial = ResponseObject(id="resp_1", created_at=0, status="in_progress", model="m", output=[])
    events = sse_body(ResponseStreamEncoder(initial), CHUNKS[0], _iterate(CHUNKS[1:]))
    return "".join([event async for event in events])


def messages_events() -> list[Event]:
    """The Messages API events for CHUNKS, decoded."""
    return [(str(name), json.loads(data)) for name, data in named_events(anyio.run(_messages_body))]


def responses_events() -> list[Event]:
    """The Responses API events for CHUNKS, decoded."""
    return [(str(name), json.loads(data)) for name, data in named_events(anyio.run(_responses_body))]


def body(events: Sequence[Event]) -> str:
    """Events back on the wire."""
    return "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events)


def position_of(events: Sequence[Event], name: str, nth: int = 0) -> int:
    """Where the `nth` event called `name` is."""
    return [index for index, (event_name, _) in enumerate(events) if event_name == name][nth]
