"""Llama 3.x JSON calls: `<|python_tag|>{"name": ..., "parameters": {...}}` (several separated by `;`), ended by
`<|eom_id|>`, `<|eot_id|>` or the end of output; or bare JSON as the whole reply (see raw_json)."""

from exo.tool_calls.format import CallRegion, CallSink
from exo.tool_calls.regions.json_call_region import JsonCallRegion
from exo.tool_calls.regions.raw_json import BARE_JSON_OPENERS, RawJsonRegion

_START = "<|python_tag|>"
_ENDS = ("<|eom_id|>", "<|eot_id|>")


class Llama3JsonFormat:
    start_markers: tuple[str, ...] = (_START,)
    bare_openers: str = BARE_JSON_OPENERS

    def open_region(self, _marker: str, sink: CallSink, /) -> CallRegion:
        return JsonCallRegion(sink, shape="semicolons", strict_shape=False, end_markers=_ENDS, start_markers=(_START,))

    def open_bare(self, sink: CallSink) -> CallRegion:
        return RawJsonRegion(sink)
