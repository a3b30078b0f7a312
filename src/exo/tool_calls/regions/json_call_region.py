"""The region reader shared by JSON formats: call objects, then an end marker (or none)."""

from collections.abc import Sequence

from exo.tool_calls.format import CallSink
from exo.tool_calls.markers import MarkerScanner
from exo.tool_calls.regions.envelope_sequence import EnvelopeSequence, SequenceShape


class JsonCallRegion:
    """Call objects after a start marker, closed by one of `end_markers`.

    After the objects, text before the end marker is content (whitespace alone is markup, dropped). When
    committed arguments stop being JSON, the rest up to the end marker is passed verbatim as arguments.
    A start marker met on the way ends this region and opens the next.
    """

    def __init__(
        self,
        sink: CallSink,
        *,
        shape: SequenceShape,
        strict_shape: bool,
        end_markers: Sequence[str],
        start_markers: Sequence[str],
    ) -> None:
        self._sink = sink
        self._sequence = EnvelopeSequence(sink, shape=shape, strict_shape=strict_shape)
        self._end_markers = tuple(end_markers)
        self._scanner = MarkerScanner((*end_markers, *start_markers))
        self._pending_whitespace = ""
        self._stray_noted = False
        self._finished = False
        self._handoff: str | None = None

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def handoff_marker(self) -> str | None:
        return self._handoff

    def feed(self, text: str, position: int) -> int:
        while position < len(text) and not (self._finished or self._sink.paused):
            if not (self._sequence.finished or self._sequence.broken):
                position = self._sequence.feed(text, position)
                if self._sequence.finished and not self._end_markers:
                    self._finished = True
                continue
            result = self._scanner.scan(text, position)
            position = result.position
            self._release(result.released)
            if result.marker is not None:
                self._end(result.marker)
        return position

    def _release(self, text: str) -> None:
        if not text:
            return
        if self._sequence.broken:
            self._sink.arguments(text)
            return
        # Trailing whitespace waits for what follows, so the outcome never depends on where text was split.
        body = text.rstrip(" \t\n\r")
        if not body:
            self._pending_whitespace += text
            return
        if not self._stray_noted:
            self._stray_noted = True
            self._sink.note_failure("text after a tool call, before its end marker, was kept as content")
        self._sink.content(self._pending_whitespace + body)
        self._pending_whitespace = text[len(body) :]

    def _end(self, marker: str) -> None:
        self._finished = True
        if marker not in self._end_markers:
            self._handoff = marker
        if self._sequence.broken:
            self._sink.close_call()

    def finish(self) -> None:
        """Generation ended inside the region."""
        if not (self._sequence.finished or self._sequence.broken):
            self._sequence.finish()
        else:
            self._release(self._scanner.flush())
            if self._sequence.broken:
                self._sink.close_call()
        self._finished = True
