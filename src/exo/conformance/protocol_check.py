"""What the Messages and Responses stream checkers share: named SSE events in, a summary and violations out."""

import json
from collections.abc import Callable
from typing import Protocol

from exo.conformance.contract import StreamedCall, StreamSummary, Violation
from exo.conformance.json_view import JsonMapping, as_object
from exo.shared.types.common import FrozenModel


def named_events(body: str) -> list[tuple[str | None, str]]:
    """The (event name, data) pairs of an SSE body, in order; multi-line data joined with newlines."""
    events: list[tuple[str | None, str]] = []
    for block in body.replace("\r\n", "\n").split("\n\n"):
        name: str | None = None
        data: list[str] = []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line.removeprefix("event:").strip()
            elif line.startswith("data:"):
                data.append(line.removeprefix("data:").removeprefix(" "))
        if data:
            events.append((name, "\n".join(data)))
    return events


def decoded_events(body: str) -> list[tuple[str | None, JsonMapping]]:
    """The (event name, decoded data) pairs of an SSE body; data that is not a JSON object reads as `{}`."""
    return [(name, as_object(json.loads(payload)) or {}) for name, payload in named_events(body)]


class ProtocolSummary(FrozenModel):
    """What a client ends up with after reading a whole stream: text, reasoning, calls, how it stopped."""

    content: str = ""
    reasoning: str = ""
    calls: tuple[StreamedCall, ...] = ()
    stop: str | None = None
    errored: bool = False

    def as_stream_summary(self) -> StreamSummary:
        """The same content, reasoning and calls in the shape the Chat Completions checker reports."""
        return StreamSummary(
            role="assistant", content=self.content, reasoning=self.reasoning, calls=self.calls, errored=self.errored
        )


class ProtocolCheck(FrozenModel):
    """The accumulated result and every violation found (empty when the stream keeps the protocol's grammar)."""

    summary: ProtocolSummary
    violations: tuple[Violation, ...]


class StreamWalker(Protocol):
    """Reads one protocol's events in order and reports what they amount to, with every grammar violation."""

    def read(self, position: int, name: str | None, data: JsonMapping) -> None: ...

    def finish(self) -> ProtocolCheck: ...


def check_protocol_stream(
    body: str,
    walker: StreamWalker,
    reader: Callable[[list[JsonMapping], ProtocolSummary], list[Violation]] | None,
    completed: Callable[[ProtocolSummary], bool],
) -> ProtocolCheck:
    """Walk an SSE body through the protocol's grammar; a stream that keeps it and `completed` is also handed to the
    SDK's `reader` (None where the SDK is not installed), whose disagreements are the violations then."""
    events = decoded_events(body)
    for position, (name, data) in enumerate(events):
        walker.read(position, name, data)
    checked = walker.finish()
    if reader is None or checked.violations or not completed(checked.summary):
        return checked
    decoded = [data for _, data in events]
    return ProtocolCheck(summary=checked.summary, violations=tuple(reader(decoded, checked.summary)))
