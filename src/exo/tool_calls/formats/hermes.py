"""Hermes / Qwen2.5 / Qwen3 `<tool_call>{"name": ..., "arguments": ...}</tool_call>`, and `generic` (the same
syntax, used when the template has none and we describe the tools ourselves). Bare JSON replies are accepted
as a fallback (see raw_json), and so are near misses of the marker (`ALIAS_STARTS`)."""

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


def _spellings(first: str, second: str) -> tuple[str, ...]:
    """`first` and `second` joined by nothing, `_` or `-`, in lower, camel, Pascal or upper case (`toolcall`,
    `toolCall`, `Tool-Call`, `TOOL_CALL`…)."""
    cases = ((first, second), (first, second.capitalize()), (first.capitalize(), second.capitalize()))
    words = (*cases, (first.upper(), second.upper()))
    return tuple(dict.fromkeys(a + joint + b for a, b in words for joint in ("", "_", "-")))


# Near misses of `<tool_call>` that small Qwen models write as plain text instead of the marker token (`<toolcall>`
# from the default 0.5B model under opencode, `<toolCall>` from the 1.5B one under Codex), and the neighbouring names
# of other families' call tags. Each opens a call only where a call object naming an offered tool follows it.
_ALIAS_NAMES: Final = tuple(
    name for first in ("tool", "function") for second in ("call", "calls") for name in _spellings(first, second)
)
ALIAS_STARTS: Final = tuple(f"<{name}>" for name in _ALIAS_NAMES if f"<{name}>" != START)
ALIAS_ENDS: Final = tuple(f"</{name}>" for name in _ALIAS_NAMES if f"</{name}>" != END)


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
    start_markers: tuple[str, ...] = (START, *ALIAS_STARTS)
    bare_openers: str = BARE_JSON_OPENERS
    grammar = HermesGrammar()

    def open_region(self, marker: str, sink: CallSink, /) -> CallRegion:
        if marker == START:
            return JsonCallRegion(sink, shape="single", strict_shape=False, end_markers=(END,), start_markers=(START,))
        # A near miss is plain text unless a call object to an offered tool follows: read strictly, as a bare reply
        # is, so anything else (prose that mentions `<toolcall>`) is declined and released unchanged.
        return JsonCallRegion(
            sink,
            shape="single",
            strict_shape=True,
            end_markers=(END, *ALIAS_ENDS),
            start_markers=self.start_markers,
        )

    def open_bare(self, sink: CallSink) -> CallRegion:
        return RawJsonRegion(sink)
