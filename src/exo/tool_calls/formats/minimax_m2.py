"""MiniMax M2: `<minimax:tool_call>\\n<invoke name="NAME">\\n<parameter name="K">V</parameter>\\n…</invoke>\\n
</minimax:tool_call>`, several `<invoke>`s in one section."""

from exo.tool_calls.formats.tagged_format import TaggedFormat
from exo.tool_calls.grammar.tagged import TagLayout
from exo.tool_calls.regions.tagged_calls import ParameterHeader, TagSyntax, unquoted


def invoke_format(section: str, section_end: str, prefix: str, label: str, newline: str = "\n") -> TaggedFormat:
    """`<PREFIXinvoke name="…">` calls with `<PREFIXparameter name="…">` arguments inside a section, each tag on
    its own line unless `newline` is ""."""
    invoke, invoke_end = f"<{prefix}invoke name=", f"</{prefix}invoke>"
    parameter, parameter_end = f"<{prefix}parameter name=", f"</{prefix}parameter>"
    syntax = TagSyntax(
        call_open=invoke,
        call_header_ends=(">",),
        param_open=parameter,
        param_header_end=">",
        param_close=parameter_end,
        call_close=invoke_end,
        call_name=unquoted,
        parameter=lambda header: ParameterHeader(unquoted(header)),
        section_close=section_end,
    )
    layout = TagLayout(
        label=label,
        opening=section,
        markers=(section, section_end),
        call_head=lambda name: (f'{invoke}"{name}">', newline),
        parameter_head=lambda name, _text: (f'{parameter}"{name}">',),
        parameter_close=parameter_end,
        after_parameter=(newline,),
        call_tail=(invoke_end, newline),
        section_head=(newline,),
        section_close=(section_end,),
    )
    return TaggedFormat(syntax, layout)


MINIMAX_M2 = invoke_format("<minimax:tool_call>", "</minimax:tool_call>", "", "minimax_m2")
