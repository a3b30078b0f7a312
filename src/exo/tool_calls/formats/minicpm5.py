"""MiniCPM5: `<function name="NAME"><param name="K">V</param></function>`, no wrapper, one call per tag."""

from exo.tool_calls.formats.tagged_format import TaggedFormat
from exo.tool_calls.grammar.tagged import TagLayout
from exo.tool_calls.regions.tagged_calls import ParameterHeader, TagSyntax, unquoted

_CALL = "<function name="
_CALL_END = "</function>"
_PARAMETER = "<param name="
_PARAMETER_END = "</param>"

MINICPM5 = TaggedFormat(
    TagSyntax(
        call_open=_CALL,
        call_header_ends=(">",),
        param_open=_PARAMETER,
        param_header_end=">",
        param_close=_PARAMETER_END,
        call_close=_CALL_END,
        call_name=unquoted,
        parameter=lambda header: ParameterHeader(unquoted(header)),
    ),
    TagLayout(
        label="minicpm5",
        opening=_CALL,
        markers=(),
        call_head=lambda name: (f'"{name}">',),
        parameter_head=lambda name, _text: (f'{_PARAMETER}"{name}">',),
        parameter_close=_PARAMETER_END,
        after_parameter=(),
        call_tail=(_CALL_END,),
    ),
)
