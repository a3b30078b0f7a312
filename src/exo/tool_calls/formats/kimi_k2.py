"""Kimi K2: `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{…}
<|tool_call_end|>…<|tool_calls_section_end|>`."""

import re

from exo.tool_calls.format import CallRegion, CallSink, MarkedFormat
from exo.tool_calls.grammar.header_json import HeaderJsonGrammar, HeaderJsonLayout
from exo.tool_calls.grammar.lark import literal
from exo.tool_calls.regions.header_json import HeaderJsonRegion, HeaderJsonSyntax

_SECTION = "<|tool_calls_section_begin|>"
_SECTION_END = "<|tool_calls_section_end|>"
_CALL = "<|tool_call_begin|>"
_ARGUMENTS = "<|tool_call_argument_begin|>"
_CALL_END = "<|tool_call_end|>"
_HEADER = re.compile(r"^\s*(?:functions\.)?(.+?)(?::\d+)?\s*$", re.DOTALL)


def _name(header: str) -> str:
    match = _HEADER.match(header)
    return match.group(1) if match is not None else header.strip()


_SYNTAX = HeaderJsonSyntax(
    call_open=_CALL, arguments_open=_ARGUMENTS, call_close=_CALL_END, section_close=_SECTION_END, call_name=_name
)


class KimiK2Format(MarkedFormat):
    start_markers: tuple[str, ...] = (_SECTION,)
    grammar = HeaderJsonGrammar(
        HeaderJsonLayout(
            opening=_SECTION,
            markers=(_SECTION, _SECTION_END, _CALL, _ARGUMENTS, _CALL_END),
            call_open=_CALL,
            header=lambda name: f"{literal(f'functions.{name}:')} /[0-9]+/",
            arguments_open=_ARGUMENTS,
            call_close=_CALL_END,
            section_close=_SECTION_END,
        )
    )

    def open_region(self, _marker: str, sink: CallSink, /) -> CallRegion:
        return HeaderJsonRegion(sink, _SYNTAX)
