"""Calls written as a header naming the tool, then JSON arguments, between begin/end tags, streamed:
Kimi K2 (`<|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{…}<|tool_call_end|>`) and DeepSeek
V3.1 (`<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{…}<｜tool▁call▁end｜>`), inside a section of calls."""

from collections.abc import Callable
from dataclasses import dataclass

from exo.tool_calls.arguments.json_stream import JsonValueStreamer
from exo.tool_calls.arguments.schema import SchemaView
from exo.tool_calls.format import CallSink
from exo.tool_calls.markers import LiteralMatcher, MarkerScanner

_LONGEST_HEADER = 512
_WHITESPACE = " \t\n\r"


@dataclass(frozen=True)
class HeaderJsonSyntax:
    call_open: str
    arguments_open: str
    call_close: str
    section_close: str
    call_name: Callable[[str], str]
    """The tool name in the header text between `call_open` and `arguments_open`."""


_EXPECT_CALL = "expect_call"
_HEADER = "header"
_ARGUMENTS = "arguments"
_VERBATIM = "verbatim"
_EXPECT_CLOSE = "expect_close"


class HeaderJsonRegion:
    """Reads a section of header + JSON calls after the format's start marker."""

    def __init__(self, sink: CallSink, syntax: HeaderJsonSyntax) -> None:
        self._sink = sink
        self._syntax = syntax
        self._state = _EXPECT_CALL
        self._matcher = LiteralMatcher((syntax.call_open, syntax.section_close))
        self._header = MarkerScanner((syntax.arguments_open,))
        self._header_parts: list[str] = []
        self._header_length = 0
        self._arguments: JsonValueStreamer | None = None
        self._verbatim = MarkerScanner((syntax.call_close, syntax.section_close))
        self._calls = 0
        self._finished = False

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def handoff_marker(self) -> str | None:
        return None

    def feed(self, text: str, position: int) -> int:
        while position < len(text) and not (self._finished or self._sink.paused):
            state = self._state
            if state == _HEADER:
                position = self._feed_header(text, position)
            elif state == _ARGUMENTS:
                position = self._feed_arguments(text, position)
            elif state == _VERBATIM:
                position = self._feed_verbatim(text, position)
            elif text[position] in _WHITESPACE and not self._matcher.partial:
                position += 1
            else:
                position = self._feed_tag(text, position)
        return position

    def _feed_tag(self, text: str, position: int) -> int:
        status, position = self._matcher.step(text, position)
        if status == LiteralMatcher.PENDING:
            return position
        tag = self._matcher.partial if status == LiteralMatcher.MATCHED else None
        self._matcher.partial = ""
        if self._state == _EXPECT_CLOSE:
            if tag is None:
                self._sink.note_failure(f"expected {self._syntax.call_close!r} after a tool call's arguments")
            self._sink.close_call()
            self._expect_call()
            if tag is None or tag == self._syntax.section_close:
                self._finished = True
        elif tag == self._syntax.call_open:
            self._state = _HEADER
            self._header_parts.clear()
            self._header_length = 0
        elif tag is not None or self._calls:
            self._finished = True  # the section's close, or content after the calls
        else:
            self._sink.reject(f"expected {self._syntax.call_open!r} to open a tool call")
        return position

    def _expect_call(self) -> None:
        self._state = _EXPECT_CALL
        self._matcher = LiteralMatcher((self._syntax.call_open, self._syntax.section_close))

    def _feed_header(self, text: str, position: int) -> int:
        result = self._header.scan(text, position)
        self._header_parts.append(result.released)
        self._header_length += len(result.released)
        if result.marker is None:
            if self._header_length > _LONGEST_HEADER:
                self._sink.reject("a tool-call header that never ends")
            return result.position
        name = self._syntax.call_name("".join(self._header_parts))
        tool = self._sink.find_tool(name)
        if tool is None:
            self._sink.reject(f"unknown tool {name!r}")
            return result.position
        self._sink.open_call(tool)
        self._calls += 1
        self._arguments = JsonValueStreamer(SchemaView.of_tool(tool.parameters))
        self._state = _ARGUMENTS
        return result.position

    def _feed_arguments(self, text: str, position: int) -> int:
        streamer = self._arguments
        assert streamer is not None
        position = streamer.feed(text, position)
        self._sink.arguments(streamer.take())
        if streamer.error is not None:
            self._sink.arguments(streamer.take_held())
            self._sink.note_failure(f"tool call arguments stopped being JSON: {streamer.error}")
            self._state = _VERBATIM
        elif streamer.done:
            self._state = _EXPECT_CLOSE
            self._matcher = LiteralMatcher((self._syntax.call_close,))
        return position

    def _feed_verbatim(self, text: str, position: int) -> int:
        result = self._verbatim.scan(text, position)
        self._sink.arguments(result.released)
        if result.marker is not None:
            self._sink.close_call()
            self._expect_call()
            self._finished = result.marker == self._syntax.section_close
        return result.position

    def finish(self) -> None:
        """Generation ended inside the region (EOS often replaces the closing tags)."""
        state = self._state
        if state == _HEADER or (state == _EXPECT_CALL and not self._calls):
            self._sink.reject("generation ended inside a tool call, before its name")
        elif state == _ARGUMENTS and self._arguments is not None:
            self._arguments.finish_scalar_at_end()
            self._sink.arguments(self._arguments.take_held())
            if not self._arguments.done:
                self._sink.note_failure("generation ended inside the tool call's arguments")
            self._sink.close_call()
        elif state == _VERBATIM:
            self._sink.arguments(self._verbatim.flush())
            self._sink.close_call()
        elif state == _EXPECT_CLOSE:
            self._sink.close_call()
        self._finished = True
