"""Bare JSON calls with no marker, only when they are the whole reply (llama3_json, and a fallback for hermes).

The default model (Qwen2.5-Coder-0.5B) sometimes answers a tool request with `{"name": ..., "arguments": ...}`,
a list of them, `;`-separated objects, or the same inside a ```json fence. Such a reply is held from its first
character until it is decided: the first key must be "name"/"arguments"/"parameters" and the name a known
tool, else the held text is content (`{"a": 1}` asked for by the user stays content).
"""

from exo.tool_calls.format import CallSink
from exo.tool_calls.markers import LiteralMatcher
from exo.tool_calls.regions.envelope_sequence import EnvelopeSequence

BARE_JSON_OPENERS = "{[`"
# A regex piece for the start of such a reply, for grammars that must keep text from beginning like a call.
BARE_JSON_CALL_START = r'(```(json|JSON)?[ \t\r\n]*)?\[?[ \t\r\n]*\{[ \t\r\n]*"(name|arguments|parameters)"'
_WHITESPACE = " \t\n\r"
_FENCE_OPENINGS = ("```json", "```JSON", "```\n")


class RawJsonRegion:
    """Reads a bare JSON reply from its first character."""

    def __init__(self, sink: CallSink) -> None:
        self._sink = sink
        self._opening: LiteralMatcher | None = None
        self._closing: LiteralMatcher | None = None
        self._fenced = False
        self._sequence: EnvelopeSequence | None = None
        self._finished = False

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def handoff_marker(self) -> str | None:
        return None

    def feed(self, text: str, position: int) -> int:
        sink = self._sink
        while position < len(text) and not (self._finished or sink.paused):
            if self._sequence is None:
                position = self._open(text, position)
            elif not (self._sequence.finished or self._sequence.broken):
                position = self._sequence.feed(text, position)
                self._finished = self._sequence.finished and not self._fenced
            elif self._sequence.broken:
                # No end marker to wait for: the rest of the reply is the broken call's arguments.
                sink.arguments(text[position:])
                position = len(text)
            else:
                position = self._close_fence(text, position)
        return position

    def _open(self, text: str, position: int) -> int:
        character = text[position]
        if self._opening is None and (character != "`" or self._fenced):
            if character in _WHITESPACE:
                return position + 1
            shape = "list" if character == "[" else "semicolons"
            self._sequence = EnvelopeSequence(self._sink, shape=shape, strict_shape=True)
            return position
        self._opening = self._opening or LiteralMatcher(_FENCE_OPENINGS)
        status, position = self._opening.step(text, position)
        if status == LiteralMatcher.MISMATCH:
            self._sink.decline()  # a code fence of another kind: an ordinary reply
        elif status == LiteralMatcher.MATCHED:
            self._fenced = True
            self._opening = None
        return position

    def _close_fence(self, text: str, position: int) -> int:
        if self._closing is None:
            if text[position] in _WHITESPACE:
                return position + 1
            self._closing = LiteralMatcher(("```",))
        status, position = self._closing.step(text, position)
        if status != LiteralMatcher.PENDING:
            if status == LiteralMatcher.MISMATCH:
                self._sink.content(self._closing.partial)
            self._finished = True
        return position

    def finish(self) -> None:
        """Generation ended inside the bare reply."""
        if self._sequence is None:
            self._sink.decline()  # the reply ended while its fence was still opening
        elif not (self._sequence.finished or self._sequence.broken):
            self._sequence.finish()
        elif self._sequence.broken:
            self._sink.close_call()
        elif self._closing is not None and self._closing.partial:
            self._sink.content(self._closing.partial)
        self._finished = True
