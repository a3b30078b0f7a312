"""Grammar pieces shared by the JSON formats: one call object `{"name": "X", "arguments": {...}}` per tool."""

import json

from exo.shared.types.tool_spec import ToolSpec
from exo.tool_calls.grammar.lark import LarkWriter, literal


def json_call_object(lark: LarkWriter, tools: tuple[ToolSpec, ...], arguments_key: str = "arguments") -> str:
    """A rule: one alternative per tool, fixed JSON text up to the arguments, the tool's schema, then `}`."""
    alternatives: list[str] = []
    for tool in tools:
        head = "{" + json.dumps("name") + ": " + json.dumps(tool.name) + ", " + json.dumps(arguments_key) + ": "
        arguments = lark.arguments(tool.parameters, every_keyword_enforced=bool(tool.strict))
        alternatives.append(lark.rule(f"call_{tool.name}", f"{literal(head)} {arguments} {literal('}')}"))
    return lark.rule("call_object", " | ".join(alternatives))


def named_json_arguments(lark: LarkWriter, tools: tuple[ToolSpec, ...], template: str) -> str:
    """A rule: one alternative per tool, `template` (with `{name}` and `{arguments}`) filled in for each.

    `template` is lark text; `{name}` becomes the tool's name as a literal, `{arguments}` its JSON arguments.
    """
    alternatives = [
        lark.rule(
            f"call_{tool.name}",
            template.format(
                name=literal(tool.name),
                arguments=lark.arguments(tool.parameters, every_keyword_enforced=bool(tool.strict)),
            ),
        )
        for tool in tools
    ]
    return lark.rule("call", " | ".join(alternatives))
