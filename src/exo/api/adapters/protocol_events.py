"""What every dialect's answer is: chunks folded through the dialect's writer, either onto the wire a chunk at a
time or into the non-streaming body, so both answers are the same fold. Messages and Responses write named SSE
events through an event encoder; chat completions and Ollama have writers of their own.
"""

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol

from pydantic import BaseModel

from exo.api.errors import ApiError, task_error
from exo.shared.types.chunks import Chunk, ErrorChunk, FinishChunk

SSE_MEDIA_TYPE = "text/event-stream"

# What the stream says when the runner ended it without a final chunk (it was cancelled under the client).
UNEXPECTED_END = ErrorChunk(error="generation_failed", message="generation ended unexpectedly")


class SseWriter(Protocol):
    """One answer's stream text in a protocol's dialect, written a chunk at a time (so keep-alives fit between)."""

    @property
    def media_type(self) -> str:
        """The stream's content type."""
        ...

    def opening(self) -> list[str]:
        """What goes out first, as soon as the request is admitted."""
        ...

    def encode(self, chunk: Chunk) -> list[str]:
        """The events of one chunk (an ErrorChunk becomes the dialect's error event)."""
        ...

    def closing(self) -> list[str]:
        """What follows the final chunk's events."""
        ...

    def keep_alive(self, where: str, /) -> list[str]:
        """What goes out after a silence, given where the request stands: an SSE comment saying so, followed by
        events that add nothing to the answer where clients count only events (Messages, Responses), or the
        dialect's own empty line where its format has no comments (Ollama)."""
        ...


class AnswerWriter(SseWriter, Protocol):
    """One answer in a dialect: its stream text a chunk at a time, and the whole body the same chunks add up to."""

    def whole(self) -> BaseModel:
        """The non-streaming answer, once the final chunk was encoded."""
        ...


def sse_comment(where: str) -> list[str]:
    """A comment line: every SSE parser skips it."""
    return [f": {where}\n\n"]


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

    def whole(self) -> BaseModel:
        """The answer the events so far describe (complete after the final chunk)."""
        ...


def sse_event(event: NamedEvent) -> str:
    """One event on the wire: its type as the SSE event name, then its JSON."""
    return f"event: {event.type}\ndata: {event.model_dump_json()}\n\n"


class NamedEventWriter:
    """A protocol whose events are named (Messages, Responses) as an AnswerWriter: the event's type names it, and
    `whole` reads the answer the encoder kept."""

    media_type = SSE_MEDIA_TYPE

    def __init__(
        self, encoder: EventEncoder, keep_alive_events: Callable[[], Sequence[NamedEvent]] | None = None
    ) -> None:
        """`keep_alive_events`: real events to send after a silence, after the comment line (Claude Code's and Codex
        CLI's idle timers count only events)."""
        self._encoder = encoder
        self._keep_alive_events = keep_alive_events

    def opening(self) -> list[str]:
        return [sse_event(event) for event in self._encoder.start()]

    def encode(self, chunk: Chunk) -> list[str]:
        return [sse_event(event) for event in self._encoder.encode(chunk)]

    def closing(self) -> list[str]:
        return []

    def keep_alive(self, where: str) -> list[str]:
        events = self._keep_alive_events() if self._keep_alive_events is not None else []
        return [*sse_comment(where), *(sse_event(event) for event in events)]

    def whole(self) -> BaseModel:
        return self._encoder.whole()


def sse_body(encoder: EventEncoder, first: Chunk, rest: AsyncIterator[Chunk]) -> AsyncIterator[str]:
    """The whole SSE body: the opening events, every chunk's events, up to the final chunk's."""
    return write_events(NamedEventWriter(encoder), first, rest)


async def fold(chunks: AsyncIterator[Chunk], answer: AnswerWriter) -> BaseModel:
    """Encode every chunk up to the final one and return the whole answer; an ErrorChunk becomes an ApiError with
    its status."""
    async for chunk in chunks:
        if isinstance(chunk, ErrorChunk):
            raise task_error(chunk)
        answer.encode(chunk)
        if isinstance(chunk, FinishChunk):
            return answer.whole()
    raise ApiError(500, "generation ended without a result", error_type="server_error")
