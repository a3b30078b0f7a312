"""Calls written as tags, one argument per tag, streamed: GLM 4.7, LongCat, MiniMax M2, MiniCPM5, Muse Spark,
Kimi K3 and DeepSeek V3.2's DSML all share this shape and differ only in their literal pieces (`TagSyntax`).

    [section open] CALL_OPEN header HEADER_END (PARAM_OPEN header PARAM_HEADER_END [VALUE_OPEN] value PARAM_CLOSE)*
    CALL_CLOSE … [SECTION_CLOSE]

A call is committed once its header names a known tool. Each parameter becomes a JSON member as it arrives: a
value the schema (or the tag itself) says is a string streams character by character; any other value is
converted by schema when its tag closes (text_values), never invented. The grammar writes the canonical layout
from the same pieces (see `TagSyntax.grammar`).
"""

import json
from collections.abc import Callable
from dataclasses import dataclass

from exo.tool_calls.arguments.schema import SchemaView
from exo.tool_calls.arguments.text_values import convert_xml_value, streams_as_string
from exo.tool_calls.format import CallSink
from exo.tool_calls.markers import LiteralMatcher, MarkerScanner

_LONGEST_HEADER = 512
_WHITESPACE = " \t\n\r"


@dataclass(frozen=True)
class ParameterHeader:
    """What a parameter's opening tag says: its name, and whether it declares the value a string (None: silent)."""

    name: str
    is_string: bool | None = None


@dataclass(frozen=True)
class TagSyntax:
    """The literal pieces of one tagged format, and how its headers name things."""

    call_open: str
    """Opens one call inside a section (for formats whose start marker opens one call itself: that marker)."""
    call_header_ends: tuple[str, ...]
    """What ends a call's header; one of them may be `param_open` or `call_close` (GLM: a newline, or neither)."""
    param_open: str
    param_header_end: str
    param_close: str
    call_close: str
    call_name: Callable[[str], str]
    """The tool name in a call header's text."""
    parameter: Callable[[str], ParameterHeader]
    """The parameter in a parameter header's text."""
    value_open: str = ""
    """A tag between the parameter header and its value (GLM's `<arg_value>`), after optional whitespace."""
    section_close: str | None = None
    """Closes a section of calls; None when the start marker opens a single call."""


def attribute(header: str, key: str) -> str | None:
    """The value of `key="…"` in a tag header, or None."""
    marker = f'{key}="'
    start = header.find(marker)
    if start < 0:
        return None
    end = header.find('"', start + len(marker))
    return header[start + len(marker) : end] if end >= 0 else None


def unquoted(header: str) -> str:
    """A header that is only a name, maybe quoted (`"get_weather"`, `get_weather`)."""
    return header.strip().strip("\"'")


_EXPECT_CALL = "expect_call"
_CALL_HEADER = "call_header"
_BODY = "body"
_PARAM_HEADER = "param_header"
_VALUE_OPEN = "value_open"
_VALUE = "value"


class TaggedCallsRegion:
    """Reads tagged calls after a format's start marker (a section of calls, or one call)."""

    def __init__(self, sink: CallSink, syntax: TagSyntax, *, in_section: bool) -> None:
        self._sink = sink
        self._syntax = syntax
        self._in_section = in_section
        self._state = _EXPECT_CALL if in_section else _CALL_HEADER
        self._matcher = LiteralMatcher((syntax.call_open,))
        self._header = MarkerScanner(syntax.call_header_ends)
        self._header_parts: list[str] = []
        self._header_length = 0
        self._calls = 0
        self._schema: SchemaView | None = None
        self._members = 0
        self._value_schema: SchemaView | None = None
        self._value_streams = False
        self._value_fresh = False
        self._value_parts: list[str] = []
        self._values = MarkerScanner(("\n" + syntax.param_close, syntax.param_close))
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
            if state in (_CALL_HEADER, _PARAM_HEADER):
                position = self._feed_header(text, position)
            elif state == _VALUE:
                position = self._feed_value(text, position)
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
        syntax = self._syntax
        if self._state == _EXPECT_CALL:
            if tag == syntax.call_open:
                self._begin_header(_CALL_HEADER, syntax.call_header_ends)
            elif tag is not None:  # the section's close
                self._finished = True
            elif self._calls == 0:
                self._sink.reject(f"expected {syntax.call_open!r} to open a tool call")
            else:
                self._finished = True  # what follows the calls is ordinary content again
        elif self._state == _VALUE_OPEN:
            if tag is None:
                self._sink.note_failure(f"expected {syntax.value_open!r} before a parameter's value")
            self._state, self._value_fresh = _VALUE, True
        elif tag == syntax.param_open:
            self._begin_header(_PARAM_HEADER, (syntax.param_header_end,))
        else:
            if tag is None:
                self._sink.note_failure("unexpected text between the parameters of a tool call")
            self._close_call()
        return position

    def _begin_header(self, state: str, ends: tuple[str, ...]) -> None:
        self._state = state
        self._header = MarkerScanner(ends)
        self._header_parts.clear()
        self._header_length = 0

    def _feed_header(self, text: str, position: int) -> int:
        result = self._header.scan(text, position)
        self._header_parts.append(result.released)
        self._header_length += len(result.released)
        if result.marker is None:
            if self._header_length > _LONGEST_HEADER:
                self._sink.reject("a tool-call tag header that never ends")
            return result.position
        header = "".join(self._header_parts)
        if self._state == _CALL_HEADER:
            self._open_call(header, result.marker)
        else:
            self._open_parameter(self._syntax.parameter(header))
        return result.position

    def _open_call(self, header: str, end: str) -> None:
        name = self._syntax.call_name(header)
        tool = self._sink.find_tool(name)
        if tool is None:
            self._sink.reject(f"unknown tool {name!r}")
            return
        self._sink.open_call(tool)
        self._calls += 1
        self._schema = SchemaView.of_tool(tool.parameters)
        self._members = 0
        self._to_body()
        if end == self._syntax.param_open:
            self._begin_header(_PARAM_HEADER, (self._syntax.param_header_end,))
        elif end == self._syntax.call_close:
            self._close_call()

    def _to_body(self) -> None:
        self._state = _BODY
        self._matcher = LiteralMatcher((self._syntax.param_open, self._syntax.call_close))

    def _open_parameter(self, header: ParameterHeader) -> None:
        self._value_schema = self._schema.property(header.name) if self._schema is not None else None
        declared = header.is_string
        self._value_streams = declared if declared is not None else streams_as_string(self._value_schema)
        opening = "{" if self._members == 0 else ", "
        self._members += 1
        quote = '"' if self._value_streams else ""
        self._sink.arguments(opening + json.dumps(header.name, ensure_ascii=False) + ": " + quote)
        if self._syntax.value_open:
            self._state = _VALUE_OPEN
            self._matcher = LiteralMatcher((self._syntax.value_open,))
        else:
            self._state, self._value_fresh = _VALUE, True

    def _feed_value(self, text: str, position: int) -> int:
        if self._value_fresh:
            # Templates often put the value on its own line: one leading newline is markup.
            self._value_fresh = False
            if text[position] == "\n":
                return position + 1
        result = self._values.scan(text, position)
        self._add_value_text(result.released)
        if result.marker is not None:
            self._end_value()
        return result.position

    def _add_value_text(self, text: str) -> None:
        if not text:
            return
        if self._value_streams:
            self._sink.arguments(json.dumps(text, ensure_ascii=False)[1:-1])
        else:
            self._value_parts.append(text)

    def _end_value(self) -> None:
        if self._value_streams:
            self._sink.arguments('"')
        else:
            value = convert_xml_value("".join(self._value_parts), self._value_schema)
            self._sink.arguments(json.dumps(value, ensure_ascii=False))
            self._value_parts.clear()
        self._to_body()

    def _close_call(self) -> None:
        self._sink.arguments("}" if self._members else "{}")
        self._sink.close_call()
        if self._in_section and self._syntax.section_close is not None:
            self._state = _EXPECT_CALL
            self._matcher = LiteralMatcher((self._syntax.call_open, self._syntax.section_close))
        else:
            self._finished = True

    def finish(self) -> None:
        """Generation ended inside the region: before a name it is content, after it the text stays as written."""
        state = self._state
        if state == _EXPECT_CALL:
            if self._calls == 0:
                self._sink.reject("generation ended before a tool call")
        elif state == _CALL_HEADER:
            self._sink.reject("generation ended inside a tool call, before its name")
        elif state == _BODY and not self._matcher.partial:
            # Every value was closed: models often end with EOS where the closing tags would be.
            self._sink.arguments("}" if self._members else "{}")
            self._sink.close_call()
        else:
            if state in (_VALUE, _VALUE_OPEN):
                partial = "".join(self._value_parts) + self._values.flush()
                written = json.dumps(partial, ensure_ascii=False)[1:-1]
                self._sink.arguments(written if self._value_streams else '"' + written)
            self._sink.note_failure("generation ended inside the tool call")
            self._sink.close_call()
        self._finished = True
