"""DeepSeek V3.2 (DSML): `<｜DSML｜function_calls>\\n<｜DSML｜invoke name="NAME">\\n<｜DSML｜parameter name="K"
string="true">V</｜DSML｜parameter>\\n…</｜DSML｜invoke>\\n</｜DSML｜function_calls>`. Each parameter says whether its
value is the raw string (`string="true"`) or JSON (`string="false"`)."""

from exo.tool_calls.formats.tagged_format import TaggedFormat
from exo.tool_calls.grammar.tagged import TagLayout
from exo.tool_calls.regions.tagged_calls import ParameterHeader, TagSyntax, attribute, unquoted

_DSML = "｜DSML｜"
SECTION = f"<{_DSML}function_calls>"
_SECTION_END = f"</{_DSML}function_calls>"
_INVOKE = f"<{_DSML}invoke name="
_INVOKE_END = f"</{_DSML}invoke>"
_PARAMETER = f"<{_DSML}parameter name="
_PARAMETER_END = f"</{_DSML}parameter>"


def _parameter(header: str) -> ParameterHeader:
    name = header.split('"')[1] if header.startswith('"') and header.count('"') >= 2 else unquoted(header)
    declared = attribute(header, "string")
    return ParameterHeader(name, None if declared is None else declared == "true")


DEEPSEEK_V32 = TaggedFormat(
    TagSyntax(
        call_open=_INVOKE,
        call_header_ends=(">",),
        param_open=_PARAMETER,
        param_header_end=">",
        param_close=_PARAMETER_END,
        call_close=_INVOKE_END,
        call_name=unquoted,
        parameter=_parameter,
        section_close=_SECTION_END,
    ),
    TagLayout(
        label="deepseek_v32",
        opening=SECTION,
        markers=(SECTION, _SECTION_END),
        call_head=lambda name: (f'{_INVOKE}"{name}">', "\n"),
        parameter_head=lambda name, text: (f'{_PARAMETER}"{name}" string="{"true" if text else "false"}">',),
        parameter_close=_PARAMETER_END,
        after_parameter=("\n",),
        call_tail=(_INVOKE_END, "\n"),
        section_head=("\n",),
        section_close=(_SECTION_END,),
    ),
)
