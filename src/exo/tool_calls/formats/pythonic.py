"""Pythonic calls (Llama 3.2/4, LFM2): `[f(a=1), g(b="x")]`, bare at the start of the reply, after
`<|python_tag|>`, or between `<|tool_call_start|>` and `<|tool_call_end|>`. Each list is parsed whole with
`ast` when it closes; every call in it is emitted, or (an unknown name, bad syntax) none and the text is
content."""

from exo.tool_calls.arguments.parsed_call import emit_parsed_calls
from exo.tool_calls.arguments.python_literals import BracketTracker, parse_pythonic_calls
from exo.tool_calls.format import CallRegion, CallSink
from exo.tool_calls.markers import MarkerScanner

_LIST_START = "<|tool_call_start|>"
_LIST_END = "<|tool_call_end|>"
_PYTHON_TAG = "<|python_tag|>"
_WHITESPACE = " \t\n\r"


def _emit(sink: CallSink, text: str) -> None:
    try:
        reason = emit_parsed_calls(sink, parse_pythonic_calls(text))
    except ValueError as error:
        reason = str(error)
    if reason is not None:
        sink.reject(f"not a pythonic tool call: {reason}")


class BracketedCallsRegion:
    """A `[...]` list read from its opening bracket (leading whitespace skipped), parsed when it closes."""

    def __init__(self, sink: CallSink) -> None:
        self._sink = sink
        self._tracker = BracketTracker(sink.meter)
        self._parts: list[str] = []
        self._opened = False
        self._finished = False

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def handoff_marker(self) -> str | None:
        return None

    def feed(self, text: str, position: int) -> int:
        while not self._opened and position < len(text) and text[position] in _WHITESPACE:
            position += 1
        if position == len(text) or self._finished:
            return position
        if not self._opened and text[position] != "[":
            self._sink.reject("expected '[' to open pythonic tool calls")
            return position
        self._opened = True
        end = self._tracker.feed(text, position)
        self._parts.append(text[position:end])
        if self._tracker.closed:
            self._finished = True
            _emit(self._sink, "".join(self._parts))
        return end

    def finish(self) -> None:
        """Generation ended before the list closed: it was never a complete call."""
        self._sink.reject("generation ended inside pythonic tool calls")
        self._finished = True


class DelimitedCallsRegion:
    """LFM2's `<|tool_call_start|>[...]<|tool_call_end|>`: captured to the end marker, then parsed."""

    def __init__(self, sink: CallSink) -> None:
        self._sink = sink
        self._scanner = MarkerScanner((_LIST_END,), sink.meter)
        self._parts: list[str] = []
        self._finished = False

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def handoff_marker(self) -> str | None:
        return None

    def feed(self, text: str, position: int) -> int:
        result = self._scanner.scan(text, position)
        self._parts.append(result.released)
        if result.marker is not None:
            self._finished = True
            _emit(self._sink, "".join(self._parts))
        return result.position

    def finish(self) -> None:
        """No end marker: parse what there is (EOS often replaces the end marker)."""
        self._parts.append(self._scanner.flush())
        self._finished = True
        _emit(self._sink, "".join(self._parts))


class PythonicFormat:
    start_markers: tuple[str, ...] = (_LIST_START, _PYTHON_TAG)
    bare_openers: str = "["

    def open_region(self, marker: str, sink: CallSink, /) -> CallRegion:
        return DelimitedCallsRegion(sink) if marker == _LIST_START else BracketedCallsRegion(sink)

    def open_bare(self, sink: CallSink) -> CallRegion:
        return BracketedCallsRegion(sink)
