"""What the Messages and Responses adapters share: chunks folded through a protocol's event encoder, either onto
the wire as named SSE events or into the non-streaming answer, so both answers are the same fold.
"""

from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from exo.api.errors import ApiError, task_error
from exo.shared.types.chunks import Chunk, ErrorChunk, FinishChunk

# What the stream says when the runner ended it without a final chunk (it was cancelled under the client).
UNEXPECTED_END = ErrorChunk(error="generation_failed", message="generation ended unexpectedly")


class SseWriter(Protocol):
    """One answer's SSE text in a protocol's dialect, written a chunk at a time (so keep-alives fit between)."""

    def opening(self) -> list[str]:
        """What goes out first, as soon as the request is admitted."""
        ...

    def encode(self, chunk: Chunk) -> list[str]:
        """The events of one chunk (an ErrorChunk becomes the dialect's error event)."""
        ...

    def closing(self) -> list[str]:
        """What follows the final chunk's events."""
        ...


def is_final(chunk: Chunk) -> bool:
    return isinstance(chunk, FinishChunk | ErrorChunk)


async def write_events(writer: SseWriter, first: Chunk, rest: AsyncIterator[Chunk]) -> AsyncIterator[str]:
    """The whole SSE body for `first` and `rest`, ended the dialect's way even if the chunks stop early."""
    for text in [*writer.opening(), *writer.encode(first)]:
        yield text
    if not is_final(first):
        async for chunk in rest:
            for text in writer.encode(chunk):
                yield text
            if is_final(chunk):
                break
        else:
            for text in writer.encode(UNEXPECTED_END):
                yield text
    for text in writer.closing():
        yield text


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


class NamedEventWriter:
    """A protocol whose events are named (Messages, Responses) as an SseWriter: the event's type names it."""

    def __init__(self, encoder: EventEncoder) -> None:
        self._encoder = encoder

    def opening(self) -> list[str]:
        return [sse_event(event) for event in self._encoder.start()]

    def encode(self, chunk: Chunk) -> list[str]:
        return [sse_event(event) for event in self._encoder.encode(chunk)]

    def closing(self) -> list[str]:
        return []


def sse_body(encoder: EventEncoder, first: Chunk, rest: AsyncIterator[Chunk]) -> AsyncIterator[str]:
    """The whole SSE body: the opening events, every chunk's events, up to the final chunk's."""
    return write_events(NamedEventWriter(encoder), first, rest)


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
