"""Hermes / Qwen2.5 / Qwen3 `<tool_call>{"name": ..., "arguments": ...}</tool_call>`, and `generic` (the same
syntax, used when the template has none and we describe the tools ourselves). Bare JSON replies are accepted
as a fallback (see raw_json)."""

from typing import Final

from exo.tool_calls.format import CallRegion, CallSink, MarkedFormat
from exo.tool_calls.grammar.bare import bare_json_calls, bare_json_starts
from exo.tool_calls.grammar.json_calls import json_call_object
from exo.tool_calls.grammar.lark import LarkWriter, literal
from exo.tool_calls.grammar.reply import BareCalls, OpenedCallsGrammar, ReplyRequest, repeated
from exo.tool_calls.regions.json_call_region import JsonCallRegion
from exo.tool_calls.regions.raw_json import BARE_JSON_CALL_START, BARE_JSON_OPENERS, RawJsonRegion

START: Final = "<tool_call>"
END: Final = "</tool_call>"


class HermesGrammar(OpenedCallsGrammar):
    """`<tool_call>\\n{"name": …, "arguments": …}\\n</tool_call>`, calls joined by a newline."""

    opening = START
    markers = (START, END)
    never_starting = (BARE_JSON_CALL_START,)
    never_in_text = ("<tool_",)

    def after_opening(self, lark: LarkWriter, request: ReplyRequest, /) -> str:
        newline = literal("\n")
        rest = lark.rule("call_rest", f"{newline} {json_call_object(lark, request.tools)} {newline} {lark.marker(END)}")
        return repeated(lark, rest, f"{newline} {lark.marker(START)}", parallel=request.parallel)

    def bare_calls(self, lark: LarkWriter, request: ReplyRequest, /) -> BareCalls:
        calls = bare_json_calls(lark, request.tools, arguments_key="arguments", parallel=request.parallel)
        return BareCalls(expression=calls, never_starting=bare_json_starts(request.tools))


class HermesFormat(MarkedFormat):
    start_markers: tuple[str, ...] = (START,)
    bare_openers: str = BARE_JSON_OPENERS
    grammar = HermesGrammar()

    def open_region(self, _marker: str, sink: CallSink, /) -> CallRegion:
        return JsonCallRegion(sink, shape="single", strict_shape=False, end_markers=(END,), start_markers=(START,))

    def open_bare(self, sink: CallSink) -> CallRegion:
        return RawJsonRegion(sink)
