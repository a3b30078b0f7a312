"""Qwen3-Coder XML calls, streamed:

    <tool_call>
    <function=name>
    <parameter=key>
    value
    </parameter>
    </function>
    </tool_call>

The name is committed when `<function=name>` closes. Each parameter becomes a JSON member as it arrives:
string-typed values stream character by character, others are converted per schema when they close
(xml_values). The `<tool_call>` wrapper may be missing, `</parameter>` may be missing before the next
parameter, parameters may come in any order. A hermes JSON object inside `<tool_call>` is read as such.
"""

import json
import re

from exo.shared.types.tool_spec import ToolSpec
from exo.tool_calls.arguments.schema import SchemaView
from exo.tool_calls.arguments.text_values import convert_xml_value, streams_as_string
from exo.tool_calls.format import CallRegion, CallSink, MarkedFormat
from exo.tool_calls.grammar.lark import LarkWriter, literal
from exo.tool_calls.grammar.parameters import (
    Parameter,
    any_parameters,
    json_value,
    parameter_sequence,
    text_value,
    tool_parameters,
)
from exo.tool_calls.grammar.reply import OpenedCallsGrammar, ReplyRequest, repeated
from exo.tool_calls.markers import LiteralMatcher, MarkerScanner
from exo.tool_calls.regions.json_call_region import JsonCallRegion

_WRAPPER = "<tool_call>"
_WRAPPER_END = "</tool_call>"
_FUNCTION = "<function="
_FUNCTION_END = "</function>"
_PARAMETER = "<parameter="
_PARAMETER_END = "</parameter>"
_VALUE_ENDS = (
    "\n" + _PARAMETER_END,
    _PARAMETER_END,
    "\n" + _PARAMETER,
    _PARAMETER,
    "\n" + _FUNCTION_END,
    _FUNCTION_END,
    "\n" + _WRAPPER_END,
    _WRAPPER_END,
)
_LONGEST_NAME = 256
_NAME_BREAK = re.compile("[<\n]")
_WHITESPACE = " \t\n\r"
_NEWLINE = "\n"

_OPENING = "opening"  # after <tool_call>: expect <function=
_NAME = "name"  # inside <function=…>
_BODY = "body"  # between parameters
_PARAMETER_NAME = "parameter_name"
_VALUE = "value"
_TAIL = "tail"  # after </function>: an optional </tool_call>


class Qwen3CoderRegion:
    """One `<function=…>…</function>` call (with or without its `<tool_call>` wrapper)."""

    def __init__(self, sink: CallSink, *, wrapped: bool) -> None:
        self._sink = sink
        self._state = _OPENING if wrapped else _NAME
        self._matcher = LiteralMatcher((_FUNCTION,))
        self._name_parts: list[str] = []
        self._name_length = 0
        self._schema: SchemaView | None = None
        self._members = 0
        self._value_schema: SchemaView | None = None
        self._value_streams = False
        self._value_fresh = False
        self._value_parts: list[str] = []
        self._values = MarkerScanner(_VALUE_ENDS)
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
            state = self._state
            if state == _VALUE:
                position = self._feed_value(text, position)
            elif state in (_NAME, _PARAMETER_NAME):
                position = self._feed_name(text, position)
            elif text[position] in _WHITESPACE and not self._matcher.partial:
                position += 1
            else:
                position = self._feed_markup(text, position)
        return position

    def _feed_markup(self, text: str, position: int) -> int:
        status, position = self._matcher.step(text, position)
        if status == LiteralMatcher.PENDING:
            return position
        marker = self._matcher.partial
        self._matcher.partial = ""
        if self._state == _OPENING:
            if status == LiteralMatcher.MISMATCH:
                self._sink.reject("expected <function=…> after <tool_call>")
            else:
                self._state = _NAME
        elif self._state == _BODY:
            self._on_body_marker(marker if status == LiteralMatcher.MATCHED else None)
            if status == LiteralMatcher.MISMATCH:
                self._sink.content(marker)
        else:
            self._finished = True
            if status == LiteralMatcher.MISMATCH:
                self._sink.content(marker)
            elif marker != _WRAPPER_END:
                self._handoff = marker
        return position

    def _on_body_marker(self, marker: str | None) -> None:
        if marker == _PARAMETER:
            self._state = _PARAMETER_NAME
            return
        if marker is None:
            self._sink.note_failure("unexpected text between the parameters of a tool call")
        self._close_function(wrapper_closed=marker == _WRAPPER_END or marker is None)

    def _feed_name(self, text: str, position: int) -> int:
        end = text.find(">", position)
        stop = len(text) if end < 0 else end
        if self._state == _NAME:
            # A function name never holds `<` or a newline: stop at the first one (wherever the text was split).
            broken = _NAME_BREAK.search(text, position, stop)
            too_long = position + _LONGEST_NAME - self._name_length
            cut = min(broken.start() if broken is not None else stop, too_long)
            if cut < stop:
                self._sink.reject("malformed <function=…> tag")
                return max(cut, position)
        piece = text[position:stop]
        self._name_parts.append(piece)
        self._name_length += len(piece)
        if end < 0:
            return len(text)
        name = "".join(self._name_parts).strip()
        self._name_parts.clear()
        self._name_length = 0
        if self._state == _NAME:
            self._open(name)
        else:
            self._open_parameter(name)
        return end + 1

    def _open(self, name: str) -> None:
        tool = self._sink.find_tool(name)
        if tool is None:
            self._sink.reject(f"unknown tool {name!r}")
            return
        self._sink.open_call(tool)
        self._schema = SchemaView.of_tool(tool.parameters)
        self._state = _BODY
        self._matcher = LiteralMatcher((_PARAMETER, _FUNCTION_END, _WRAPPER_END))

    def _open_parameter(self, name: str) -> None:
        self._value_schema = self._schema.property(name) if self._schema is not None else None
        self._value_streams = streams_as_string(self._value_schema)
        opening = "{" if self._members == 0 else ", "
        self._members += 1
        self._sink.arguments(
            opening + json.dumps(name, ensure_ascii=False) + ": " + ('"' if self._value_streams else "")
        )
        self._value_fresh = True
        self._state = _VALUE

    def _feed_value(self, text: str, position: int) -> int:
        if self._value_fresh:
            # The template puts the value on its own line: one leading newline is markup.
            self._value_fresh = False
            if text[position] == "\n":
                return position + 1
        result = self._values.scan(text, position)
        self._add_value_text(result.released)
        if result.marker is not None:
            self._end_value(result.marker.strip())
        return result.position

    def _add_value_text(self, text: str) -> None:
        if not text:
            return
        if self._value_streams:
            self._sink.arguments(json.dumps(text, ensure_ascii=False)[1:-1])
        else:
            self._value_parts.append(text)

    def _end_value(self, marker: str) -> None:
        if self._value_streams:
            self._sink.arguments('"')
        else:
            value = convert_xml_value("".join(self._value_parts), self._value_schema)
            self._sink.arguments(json.dumps(value, ensure_ascii=False))
            self._value_parts.clear()
        self._state = _BODY
        if marker == _PARAMETER:
            self._sink.note_failure("a tool call parameter was not closed by </parameter>")
            self._state = _PARAMETER_NAME
        elif marker != _PARAMETER_END:
            self._close_function(wrapper_closed=marker == _WRAPPER_END)

    def _close_function(self, *, wrapper_closed: bool) -> None:
        self._sink.arguments("}" if self._members else "{}")
        self._state = _TAIL
        self._matcher = LiteralMatcher((_WRAPPER_END, _FUNCTION, _WRAPPER))
        self._finished = wrapper_closed
        self._sink.close_call()

    def finish(self) -> None:
        """Generation ended inside the call: before the name it is content, after it the text stays as written."""
        state = self._state
        if state in (_OPENING, _NAME):
            self._sink.reject("generation ended inside a tool call, before its name")
        elif state == _TAIL:
            self._sink.content(self._matcher.partial)
        else:
            if state == _VALUE:
                partial = "".join(self._value_parts) + self._values.flush()
                written = json.dumps(partial, ensure_ascii=False)[1:-1]
                self._sink.arguments(written if self._value_streams else '"' + written)
            self._sink.note_failure("generation ended inside the tool call")
            self._sink.close_call()
        self._finished = True


class WrapperRegion:
    """After `<tool_call>`: the XML call, or the hermes JSON object Qwen3 models sometimes write there instead."""

    def __init__(self, sink: CallSink) -> None:
        self._sink = sink
        self._inner: CallRegion | None = None

    @property
    def finished(self) -> bool:
        return self._inner is not None and self._inner.finished

    @property
    def handoff_marker(self) -> str | None:
        return self._inner.handoff_marker if self._inner is not None else None

    def feed(self, text: str, position: int) -> int:
        if self._inner is None:
            while position < len(text) and text[position] in _WHITESPACE:
                position += 1
            if position == len(text):
                return position
            if text[position] == "{":
                self._inner = JsonCallRegion(
                    self._sink,
                    shape="single",
                    strict_shape=False,
                    end_markers=(_WRAPPER_END,),
                    start_markers=(_WRAPPER, _FUNCTION),
                )
            else:
                self._inner = Qwen3CoderRegion(self._sink, wrapped=True)
        return self._inner.feed(text, position)

    def finish(self) -> None:
        """Generation ended inside the region."""
        if self._inner is None:
            self._sink.reject("generation ended right after <tool_call>")
        else:
            self._inner.finish()


class Qwen3CoderGrammar(OpenedCallsGrammar):
    """`<tool_call>` NL `<function=NAME>` NL (`<parameter=K>` NL VALUE NL `</parameter>` NL)* `</function>` NL
    `</tool_call>`, as the Qwen3-Coder template renders calls; calls joined by a newline."""

    opening = _WRAPPER
    markers = (_WRAPPER, _WRAPPER_END)
    also_opening = (_FUNCTION,)

    def after_opening(self, lark: LarkWriter, request: ReplyRequest, /) -> str:
        functions = " | ".join(lark.rule(f"function_{tool.name}", self._function(lark, tool)) for tool in request.tools)
        closing = f"{literal(_FUNCTION_END + _NEWLINE)} {lark.marker(_WRAPPER_END)}"
        rest = lark.rule("call_rest", f"{literal(_NEWLINE)} ({functions}) {closing}")
        return repeated(lark, rest, f"{literal(_NEWLINE)} {lark.marker(_WRAPPER)}", parallel=request.parallel)

    def _function(self, lark: LarkWriter, tool: ToolSpec) -> str:
        head = literal(f"{_FUNCTION}{tool.name}>{_NEWLINE}")
        parameters = tool_parameters(tool, "qwen3_coder")
        if parameters is None:
            return f"{head} {any_parameters(lark, lambda name: self._any_parameter(lark, name))}"
        return f"{head} {parameter_sequence(lark, parameters, lambda parameter: self._parameter(lark, parameter))}"

    def _parameter(self, lark: LarkWriter, parameter: Parameter) -> str:
        head = literal(f"{_PARAMETER}{parameter.name}>{_NEWLINE}")
        end = _NEWLINE + _PARAMETER_END
        if parameter.is_text:
            return f"{head} {text_value(lark, parameter, end, 'qwen3_coder')} {literal(_NEWLINE)}"
        return f"{head} {json_value(lark, parameter)} {literal(end + _NEWLINE)}"

    def _any_parameter(self, lark: LarkWriter, name: str) -> str:
        value = lark.text_until(_NEWLINE + _PARAMETER_END, "value")
        return f"{literal(_PARAMETER)} {name} {literal('>' + _NEWLINE)} {value} {literal(_NEWLINE)}"


class Qwen3CoderFormat(MarkedFormat):
    start_markers: tuple[str, ...] = (_WRAPPER, _FUNCTION)
    grammar = Qwen3CoderGrammar()

    def open_region(self, marker: str, sink: CallSink, /) -> CallRegion:
        return WrapperRegion(sink) if marker == _WRAPPER else Qwen3CoderRegion(sink, wrapped=False)
