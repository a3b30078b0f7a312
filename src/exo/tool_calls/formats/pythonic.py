"""Pythonic calls (Llama 3.2/4, LFM2): `[f(a=1), g(b="x")]`, bare at the start of the reply, after
`<|python_tag|>`, or between `<|tool_call_start|>` and `<|tool_call_end|>`. Each list is parsed whole with
`ast` when it closes; every call in it is emitted, or (an unknown name, bad syntax) none and the text is
content."""

import re

from exo.shared.types.tool_spec import ToolSpec
from exo.tool_calls.arguments.python_literals import BracketTracker, parse_pythonic_calls
from exo.tool_calls.format import CallRegion, CallSink, MarkedFormat
from exo.tool_calls.grammar.lark import LarkWriter, literal
from exo.tool_calls.grammar.parameters import any_parameters, json_value, parameter_sequence, tool_parameters
from exo.tool_calls.grammar.reply import BareCalls, OpenedCallsGrammar, ReplyRequest, repeated
from exo.tool_calls.markers import MarkerScanner
from exo.tool_calls.regions.parsed_calls import emit_parsed_calls

_LIST_START = "<|tool_call_start|>"
_LIST_END = "<|tool_call_end|>"
_PYTHON_TAG = "<|python_tag|>"
_WHITESPACE = " \t\n\r"
# What a reply that is a list of calls starts with (a markdown link "[the docs](…)" does not).
_CALL_LIST_START = r"\[[ \t\r\n]*[A-Za-z_][A-Za-z0-9_.]*\("


def _emit(sink: CallSink, text: str, *, bare: bool = False) -> None:
    try:
        reason = emit_parsed_calls(sink, parse_pythonic_calls(text))
    except ValueError as error:
        reason = str(error)
    if reason is not None:
        _refuse(sink, text, f"not a pythonic tool call: {reason}", bare=bare)


def _refuse(sink: CallSink, text: str, reason: str, *, bare: bool) -> None:
    """A bare list that never began like calls (`[1, 2]`, a markdown link) is content, not a failed call."""
    if bare and re.match(_CALL_LIST_START, text) is None:
        sink.decline()
    else:
        sink.reject(reason)


class BracketedCallsRegion:
    """A `[...]` list read from its opening bracket (leading whitespace skipped), parsed when it closes.

    `bare`: the list opened the reply with no marker before it, so it may be ordinary text."""

    def __init__(self, sink: CallSink, *, bare: bool = False) -> None:
        self._sink = sink
        self._bare = bare
        self._tracker = BracketTracker()
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
            _emit(self._sink, "".join(self._parts), bare=self._bare)
        return end

    def finish(self) -> None:
        """Generation ended before the list closed: it was never a complete call."""
        _refuse(self._sink, "".join(self._parts), "generation ended inside pythonic tool calls", bare=self._bare)
        self._finished = True


class DelimitedCallsRegion:
    """LFM2's `<|tool_call_start|>[...]<|tool_call_end|>`: captured to the end marker, then parsed."""

    def __init__(self, sink: CallSink) -> None:
        self._sink = sink
        self._scanner = MarkerScanner((_LIST_END,))
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


class PythonicGrammar(OpenedCallsGrammar):
    """`[f(a=1, b="x"), g()]`: bare at the start of the reply, or between LFM2's `<|tool_call_start|>` and
    `<|tool_call_end|>` where the tokenizer has those as tokens. Values are JSON text, which Python reads as the
    same literals (the parser maps true/false/null)."""

    opening = "["
    markers = (_LIST_START, _LIST_END)
    never_starting = (_CALL_LIST_START,)
    bare = True
    also_opening = (_LIST_START, _PYTHON_TAG)

    def opening_expression(self, lark: LarkWriter) -> str:
        if _LIST_START in lark.special_tokens:
            return f"{lark.marker(_LIST_START)} {literal('[')}"
        return literal("[")

    def after_opening(self, lark: LarkWriter, request: ReplyRequest, /) -> str:
        calls = " | ".join(lark.rule(f"call_{tool.name}", self._call(lark, tool)) for tool in request.tools)
        listed = repeated(lark, lark.rule("call", calls), literal(", "), parallel=request.parallel)
        closing = f" {lark.marker(_LIST_END)}" if _LIST_START in lark.special_tokens else ""
        return f"{listed} {literal(']')}{closing}"

    def marked_opening_is_token(self, lark: LarkWriter) -> bool:
        return _LIST_START in lark.special_tokens

    def bare_calls(self, lark: LarkWriter, request: ReplyRequest, /) -> BareCalls:
        """`[` and an offered tool's name and `(` make a call list (one lexeme, see grammar/bare.py); `[1, 2]`,
        a markdown link or `[other(` stay text."""
        names = "(" + "|".join(re.escape(tool.name) for tool in request.tools) + ")"
        firsts: list[str] = []
        for tool in request.tools:
            opening = rf"[ \t\r\n]*\[[ \t\r\n]*{re.escape(tool.name)}\("
            firsts.append(lark.rule(f"bare_{tool.name}", f"/{opening}/ {self._arguments(lark, tool)}"))
        first = " | ".join(firsts)
        if request.parallel:
            calls = " | ".join(lark.rule(f"call_{tool.name}", self._call(lark, tool)) for tool in request.tools)
            first = f"({first}) ({literal(', ')} ({calls}))*"
        return BareCalls(expression=f"{first} {literal(']')}", never_starting=(rf"\[[ \t\r\n]*{names}\(",))

    def _call(self, lark: LarkWriter, tool: ToolSpec) -> str:
        return f"{literal(tool.name + '(')} {self._arguments(lark, tool)}"

    def _arguments(self, lark: LarkWriter, tool: ToolSpec) -> str:
        """A call's arguments and its closing `)`, after `name(`."""
        parameters = tool_parameters(tool, "pythonic")
        if parameters is None:
            arguments = any_parameters(lark, lambda name: f"{name} {literal('=')} %json {{}}", separator=literal(", "))
        else:
            arguments = parameter_sequence(
                lark,
                parameters,
                lambda parameter: f"{literal(parameter.name + '=')} {json_value(lark, parameter)}",
                separator=literal(", "),
            )
        return f"{arguments} {literal(')')}"


class PythonicFormat(MarkedFormat):
    start_markers: tuple[str, ...] = (_LIST_START, _PYTHON_TAG)
    bare_openers: str = "["
    grammar = PythonicGrammar()

    def open_region(self, marker: str, sink: CallSink, /) -> CallRegion:
        return DelimitedCallsRegion(sink) if marker == _LIST_START else BracketedCallsRegion(sink)

    def open_bare(self, sink: CallSink) -> CallRegion:
        return BracketedCallsRegion(sink, bare=True)
