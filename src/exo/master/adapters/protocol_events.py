"""What the Messages and Responses adapters share: chunks folded through a protocol's event encoder, either onto
the wire as named SSE events or into the non-streaming answer, so both answers are the same fold.
"""

from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from exo.master.errors import ApiError, task_error
from exo.shared.types.chunks import Chunk, ErrorChunk, FinishChunk


class NamedEvent(Protocol):
    """A protocol event: its `type` is the SSE event name."""

    @property
    def type(self) -> str: ...

    def model_dump_json(self) -> str: ...


class EventEncoder(Protocol):
    """Turns one answer's chunks into a protocol's events, keeping the answer they describe."""

    def start(self) -> Sequence[NamedEvent]: ...

    def encode(self, chunk: Chunk) -> Sequence[NamedEvent]: ...


def sse_event(event: NamedEvent) -> str:
    """One event on the wire: its type as the SSE event name, then its JSON."""
    return f"event: {event.type}\ndata: {event.model_dump_json()}\n\n"


async def sse_body(encoder: EventEncoder, first: Chunk, rest: AsyncIterator[Chunk]) -> AsyncIterator[str]:
    """The whole SSE body: the opening events, every chunk's events, up to the final chunk's."""
    for event in [*encoder.start(), *encoder.encode(first)]:
        yield sse_event(event)
    if isinstance(first, FinishChunk | ErrorChunk):
        return
    async for chunk in rest:
        for event in encoder.encode(chunk):
            yield sse_event(event)
        if isinstance(chunk, FinishChunk | ErrorChunk):
            return
    # The runner ended the stream without a final chunk (it was cancelled): still end it the protocol's way.
    for event in encoder.encode(ErrorChunk(error="generation_failed", message="generation ended unexpectedly")):
        yield sse_event(event)


async def fold_chunks(chunks: AsyncIterator[Chunk], encoder: EventEncoder) -> None:
    """Encode every chunk up to the final one (the answer is then complete in `encoder`); an ErrorChunk becomes
    an ApiError with its status."""
    async for chunk in chunks:
        if isinstance(chunk, ErrorChunk):
            raise task_error(chunk)
        encoder.encode(chunk)
        if isinstance(chunk, FinishChunk):
            return
    raise ApiError(500, "generation ended without a result", error_type="server_error")
