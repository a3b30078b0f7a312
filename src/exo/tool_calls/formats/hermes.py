"""Hermes / Qwen2.5 / Qwen3 `<tool_call>{"name": ..., "arguments": ...}</tool_call>`, and `generic` (the same
syntax, used when the template has none and we describe the tools ourselves). Bare JSON replies are accepted
as a fallback (see raw_json)."""

from exo.tool_calls.format import CallRegion, CallSink
from exo.tool_calls.regions.json_call_region import JsonCallRegion
from exo.tool_calls.regions.raw_json import BARE_JSON_OPENERS, RawJsonRegion

_START = "<tool_call>"
_END = "</tool_call>"


class HermesFormat:
    start_markers: tuple[str, ...] = (_START,)
    bare_openers: str = BARE_JSON_OPENERS

    def open_region(self, _marker: str, sink: CallSink, /) -> CallRegion:
        return JsonCallRegion(sink, shape="single", strict_shape=False, end_markers=(_END,), start_markers=(_START,))

    def open_bare(self, sink: CallSink) -> CallRegion:
        return RawJsonRegion(sink)
