"""Kimi K3 (XTML): `<|open|>tools<|sep|><|open|>call tool="NAME" index="1"<|sep|><|open|>argument key="K"
type="string"<|sep|>V<|close|>argument<|sep|>…<|close|>call<|sep|><|close|>tools<|sep|>`. (The alternative
`<|open|>json …` block of whole JSON arguments is not read: such a call is kept with the arguments read so far.)"""

from exo.tool_calls.formats.tagged_format import TaggedFormat
from exo.tool_calls.grammar.tagged import Pattern, TagLayout
from exo.tool_calls.regions.tagged_calls import ParameterHeader, TagSyntax, attribute

_OPEN, _CLOSE, _SEP = "<|open|>", "<|close|>", "<|sep|>"


def _parameter(header: str) -> ParameterHeader:
    declared = attribute(header, "type")
    return ParameterHeader(attribute(header, "key") or "", None if declared is None else declared == "string")


KIMI_K3 = TaggedFormat(
    TagSyntax(
        call_open=f"{_OPEN}call",
        call_header_ends=(_SEP,),
        param_open=f"{_OPEN}argument",
        param_header_end=_SEP,
        param_close=f"{_CLOSE}argument{_SEP}",
        call_close=f"{_CLOSE}call{_SEP}",
        call_name=lambda header: attribute(header, "tool") or "",
        parameter=_parameter,
        section_close=f"{_CLOSE}tools{_SEP}",
    ),
    TagLayout(
        label="kimi_k3",
        opening=f"{_OPEN}tools{_SEP}",
        opening_pieces=(_OPEN, "tools", _SEP),
        markers=(_OPEN, _CLOSE, _SEP),
        call_head=lambda name: (_OPEN, f'call tool="{name}" index="', Pattern("[0-9]+"), '"', _SEP),
        parameter_head=lambda name, text: (
            _OPEN,
            f'argument key="{name}" type="',
            "string" if text else Pattern("(integer|number|boolean|object|array|null)"),
            '"',
            _SEP,
        ),
        parameter_close=_CLOSE,
        after_parameter=("argument", _SEP),
        call_tail=(_CLOSE, "call", _SEP),
        section_close=(_CLOSE, "tools", _SEP),
    ),
)
