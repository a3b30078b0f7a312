"""Llama 3.x JSON calls: `<|python_tag|>{"name": ..., "parameters": {...}}` (several separated by `;`), ended by
`<|eom_id|>`, `<|eot_id|>` or the end of output; or bare JSON as the whole reply (see raw_json)."""

from typing import Final

from exo.tool_calls.format import CallRegion, CallSink, MarkedFormat
from exo.tool_calls.grammar.json_calls import json_call_object
from exo.tool_calls.grammar.lark import LarkWriter
from exo.tool_calls.grammar.reply import ReplyRequest, ReplyShape
from exo.tool_calls.regions.json_call_region import JsonCallRegion
from exo.tool_calls.regions.raw_json import BARE_JSON_OPENERS, RawJsonRegion

PYTHON_TAG: Final = "<|python_tag|>"
_ENDS = ("<|eom_id|>", "<|eot_id|>")
_OPEN_BRACE = r"\{"


class Llama3JsonGrammar:
    """One `{"name": …, "parameters": …}` object, after `<|python_tag|>` where the tokenizer has it as a token
    (one call: parallel calls are not part of the format). Text that opens with "{" is a call, as Llama's own
    prompt format reads it."""

    marker_texts: tuple[str, ...] = (PYTHON_TAG,)

    def reply(self, lark: LarkWriter, request: ReplyRequest, /) -> str:
        body = json_call_object(lark, request.tools, "parameters") if request.shape is not ReplyShape.TEXT_ONLY else ""
        call = f"<[{lark.special_tokens[PYTHON_TAG]}]>? {body}" if PYTHON_TAG in lark.special_tokens else body
        match request.shape:
            case ReplyShape.CALLS:
                return call
            case ReplyShape.ANSWER_OR_CALLS:
                # Both alternatives may open with "{": the parser reads a reply shaped like a call as the call.
                return f"answer | {call}"
            case ReplyShape.TEXT_ONLY:
                return lark.prose(never_containing=(PYTHON_TAG,), never_starting=(_OPEN_BRACE,))
            case ReplyShape.TEXT_OR_CALLS:
                prose = lark.prose(never_containing=(PYTHON_TAG,), never_starting=(_OPEN_BRACE,))
                return f"{prose} | {call}"


class Llama3JsonFormat(MarkedFormat):
    start_markers: tuple[str, ...] = (PYTHON_TAG,)
    bare_openers: str = BARE_JSON_OPENERS
    grammar = Llama3JsonGrammar()

    def open_region(self, _marker: str, sink: CallSink, /) -> CallRegion:
        return JsonCallRegion(
            sink, shape="semicolons", strict_shape=False, end_markers=_ENDS, start_markers=(PYTHON_TAG,)
        )

    def open_bare(self, sink: CallSink) -> CallRegion:
        return RawJsonRegion(sink)
