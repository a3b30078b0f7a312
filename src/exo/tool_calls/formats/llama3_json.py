"""Llama 3.x JSON calls: `<|python_tag|>{"name": ..., "parameters": {...}}` (several separated by `;`), ended by
`<|eom_id|>`, `<|eot_id|>` or the end of output; or bare JSON as the whole reply (see raw_json)."""

from typing import Final

from exo.tool_calls.format import CallRegion, CallSink, MarkedFormat
from exo.tool_calls.grammar.bare import bare_json_calls, bare_json_starts
from exo.tool_calls.grammar.json_calls import json_call_object
from exo.tool_calls.grammar.lark import LarkWriter
from exo.tool_calls.grammar.reply import ReplyRequest
from exo.tool_calls.grammar.spec import ReplyShape
from exo.tool_calls.regions.json_call_region import JsonCallRegion
from exo.tool_calls.regions.raw_json import BARE_JSON_OPENERS, RawJsonRegion

PYTHON_TAG: Final = "<|python_tag|>"
_ENDS = ("<|eom_id|>", "<|eot_id|>")
_OPEN_BRACE = r"\{"


class Llama3JsonGrammar:
    """One `{"name": …, "parameters": …}` object, after `<|python_tag|>` where the tokenizer has it as a token
    (one call: parallel calls are not part of the format). Where calls are forced or forbidden, text that opens
    with "{" is a call, as Llama's own prompt format reads it; under "auto" only a bare opening the parser would
    read as a call is one (see grammar/bare.py)."""

    marker_texts: tuple[str, ...] = (PYTHON_TAG,)

    def reply(self, lark: LarkWriter, request: ReplyRequest, /) -> str:
        tag = f"<[{lark.special_tokens[PYTHON_TAG]}]>" if PYTHON_TAG in lark.special_tokens else None
        match request.shape:
            case ReplyShape.CALLS:
                return self._call(lark, request, tag)
            case ReplyShape.ANSWER_OR_CALLS:
                # Both alternatives may open with "{": the parser reads a reply shaped like a call as the call.
                return f"answer | {self._call(lark, request, tag)}"
            case ReplyShape.TEXT_ONLY:
                return lark.prose(never_containing=(PYTHON_TAG,), never_starting=(_OPEN_BRACE,))
            case ReplyShape.TEXT_OR_CALLS:
                # Text that begins like a bare call to an offered tool is that call (see grammar/bare.py); other
                # text, `{"a": 1}` included, stays text.
                prose = lark.prose(never_containing=(PYTHON_TAG,), never_starting=bare_json_starts(request.tools))
                bare = bare_json_calls(lark, request.tools, arguments_key="parameters", parallel=False)
                if tag is None:
                    return f"{prose} | {bare}"
                return f"{prose} | {bare} | {tag} {json_call_object(lark, request.tools, 'parameters')}"

    def _call(self, lark: LarkWriter, request: ReplyRequest, tag: str | None) -> str:
        body = json_call_object(lark, request.tools, "parameters")
        return f"{tag}? {body}" if tag else body


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
