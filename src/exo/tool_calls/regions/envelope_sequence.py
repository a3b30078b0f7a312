"""Several JSON call objects in a row: `[{..}, {..}]`, `{..}; {..}`, or just one."""

from typing import Literal

from exo.tool_calls.format import CallSink
from exo.tool_calls.regions.json_envelope import EnvelopeParser

_WHITESPACE = " \t\n\r"
SequenceShape = Literal["single", "semicolons", "list"]


class EnvelopeSequence:
    """Reads call objects until the shape ends; whitespace between them is markup and is dropped."""

    def __init__(self, sink: CallSink, *, shape: SequenceShape, strict_shape: bool) -> None:
        self._sink = sink
        self._shape: SequenceShape = shape
        self._strict = strict_shape
        self._envelope: EnvelopeParser | None = None if shape == "list" else self._new_envelope()
        self._between = False
        self.finished = False
        self.broken = False

    def _new_envelope(self) -> EnvelopeParser:
        return EnvelopeParser(self._sink, strict_shape=self._strict)

    def feed(self, text: str, position: int) -> int:
        sink = self._sink
        while position < len(text) and not (self.finished or self.broken or sink.paused):
            envelope = self._envelope
            if envelope is not None and not self._between:
                position = envelope.feed(text, position)
                self.broken = envelope.broken
                if envelope.finished:
                    self._between = True
                    self.finished = self._shape == "single"
                continue
            character = text[position]
            if character in _WHITESPACE:
                position += 1
            elif envelope is None:
                if character != "[":
                    self._refuse(f"expected '[' to open a list of tool calls, got {character!r}")
                    return position
                self._envelope = self._new_envelope()
                position += 1
            elif character == ("," if self._shape == "list" else ";"):
                self._envelope = self._new_envelope()
                self._between = False
                position += 1
            else:
                if self._shape == "list" and character != "]":
                    sink.note_failure(f"unexpected {character!r} after a tool call in a list")
                self.finished = True
                return position + 1 if character == "]" and self._shape == "list" else position
        return position

    def _refuse(self, reason: str) -> None:
        """No call object began: bare text (strict shape) was never a call; after a marker it is a failed one."""
        if self._strict:
            self._sink.decline()
        else:
            self._sink.reject(reason)

    def finish(self) -> None:
        """Generation ended inside the sequence."""
        if self._envelope is None:
            self._refuse("generation ended inside a list of tool calls")
        elif not self._between:
            self._envelope.finish()
        self.finished = True
