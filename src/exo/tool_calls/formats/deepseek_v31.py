"""DeepSeek V3.1 (and V3.2-Exp): `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{…}<｜tool▁call▁end｜>…
<｜tool▁calls▁end｜>`. (The markers use the full-width bar ｜ and ▁, as DeepSeek's tokenizer spells them.)"""

from exo.tool_calls.format import CallRegion, CallSink, MarkedFormat
from exo.tool_calls.grammar.header_json import HeaderJsonGrammar, HeaderJsonLayout
from exo.tool_calls.grammar.lark import literal
from exo.tool_calls.regions.header_json import HeaderJsonRegion, HeaderJsonSyntax

SECTION = "<｜tool▁calls▁begin｜>"
_SECTION_END = "<｜tool▁calls▁end｜>"
_CALL = "<｜tool▁call▁begin｜>"
_SEPARATOR = "<｜tool▁sep｜>"
_CALL_END = "<｜tool▁call▁end｜>"

_SYNTAX = HeaderJsonSyntax(
    call_open=_CALL,
    arguments_open=_SEPARATOR,
    call_close=_CALL_END,
    section_close=_SECTION_END,
    call_name=lambda header: header.strip(),
)


class DeepSeekV31Format(MarkedFormat):
    start_markers: tuple[str, ...] = (SECTION,)
    grammar = HeaderJsonGrammar(
        HeaderJsonLayout(
            opening=SECTION,
            markers=(SECTION, _SECTION_END, _CALL, _SEPARATOR, _CALL_END),
            call_open=_CALL,
            header=literal,
            arguments_open=_SEPARATOR,
            call_close=_CALL_END,
            section_close=_SECTION_END,
        )
    )

    def open_region(self, _marker: str, sink: CallSink, /) -> CallRegion:
        return HeaderJsonRegion(sink, _SYNTAX)
