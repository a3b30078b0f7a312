"""GLM 4.5 / 4.6 / 4.7 and Poolside Laguna: `<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n…
</tool_call>`, one call per `<tool_call>`."""

from exo.tool_calls.formats.tagged_format import TaggedFormat
from exo.tool_calls.grammar.tagged import TagLayout
from exo.tool_calls.regions.tagged_calls import ParameterHeader, TagSyntax, unquoted


def key_value_format(prefix: str, label: str) -> TaggedFormat:
    """GLM's layout with its tags prefixed (LongCat writes `<longcat_tool_call>`, `<longcat_arg_key>`…)."""
    call, call_end = f"<{prefix}tool_call>", f"</{prefix}tool_call>"
    key, key_end = f"<{prefix}arg_key>", f"</{prefix}arg_key>"
    value, value_end = f"<{prefix}arg_value>", f"</{prefix}arg_value>"
    syntax = TagSyntax(
        call_open=call,
        call_header_ends=("\n", key, call_end),
        param_open=key,
        param_header_end=key_end,
        value_open=value,
        param_close=value_end,
        call_close=call_end,
        call_name=unquoted,
        parameter=lambda header: ParameterHeader(unquoted(header)),
    )
    layout = TagLayout(
        label=label,
        opening=call,
        markers=(call, call_end, key, key_end, value, value_end),
        call_head=lambda name: (name, "\n"),
        parameter_head=lambda name, _text: (key, name, key_end, "\n", value),
        parameter_close=value_end,
        after_parameter=("\n",),
        call_tail=(call_end,),
        between_calls=("\n",),
    )
    return TaggedFormat(syntax, layout)


GLM47 = key_value_format("", "glm47")
