"""Calls written with no marker at the very start of a reply (a bare JSON object, a pythonic list), in a grammar
that also lets the reply be free text.

Their openings are ambiguous with prose (`{`, `[`), so the grammar decides at the point where exo's parser
decides: a reply is a call once it has begun exactly as the parser's bare-call test reads a call (a JSON object
whose first key is "name" with the name of an offered tool; `[` then an offered tool's name and `(`). Until then
it is free text, and prose that merely starts with `{` or `[` (`{"a": 1}`, `[1, 2]`, a markdown link, a name that
is no tool's) never has to become a call. Text may not begin with the call opening itself unless it is the call.

llguidance lexes greedily: a free-text lexeme that can still grow wins over a short literal such as `{`. So each
bare call opens with one regex lexeme that spans the whole decision (from the first character through the tool's
name), written beside the free text: the free text dies exactly where that lexeme commits, and the rest of the
call is constrained like a marked one.
"""

import re
from collections.abc import Sequence

from exo.shared.types.tool_spec import ToolSpec
from exo.tool_calls.grammar.json_calls import json_call_object
from exo.tool_calls.grammar.lark import LarkWriter, literal

_SPACE = r"[ \t\r\n]*"
_FENCE = rf"```(json|JSON)?{_SPACE}"
_LIST = r"\["


def _lexeme(*pieces: str) -> str:
    """One lark regex lexeme made of regex pieces."""
    return "/" + "".join(pieces).replace("/", "\\/") + "/"


def _names(tools: Sequence[ToolSpec]) -> str:
    return "(" + "|".join(re.escape(tool.name) for tool in tools) + ")"


def bare_json_starts(tools: Sequence[ToolSpec]) -> tuple[str, ...]:
    """Regex pieces free text may not start with: a bare JSON call to one of `tools`, and any object whose first
    key is "arguments"/"parameters" (the parser reads that as a call too, and the grammar writes only "name")."""
    opening = rf"({_FENCE})?\[?{_SPACE}\{{{_SPACE}"
    return (
        rf'{opening}"name"{_SPACE}:{_SPACE}"{_names(tools)}"',
        rf'{opening}"(arguments|parameters)"',
    )


def bare_json_calls(lark: LarkWriter, tools: Sequence[ToolSpec], *, arguments_key: str, parallel: bool) -> str:
    """The bare JSON call alternatives: one object, a ```json fenced object, or (parallel) a list of objects."""
    head = rf'\{{{_SPACE}"name"{_SPACE}:{_SPACE}'
    rest = literal(f', "{arguments_key}": ')
    singles: list[str] = []
    listed: list[str] = []
    fenced: list[str] = []
    for tool in tools:
        name = re.escape(f'"{tool.name}"')
        arguments = lark.arguments(tool.parameters, every_keyword_enforced=bool(tool.strict))
        body = lark.rule(f"bare_arguments_{tool.name}", f"{rest} {arguments} {literal('}')}")
        singles.append(lark.rule(f"bare_{tool.name}", f"{_lexeme(_SPACE, head, name)} {body}"))
        fenced.append(lark.rule(f"fenced_{tool.name}", f"{_lexeme(_SPACE, _FENCE, head, name)} {body}"))
        if parallel:
            listed.append(lark.rule(f"listed_{tool.name}", f"{_lexeme(_SPACE, _LIST, _SPACE, head, name)} {body}"))
    fence_close = literal("\n```")
    alternatives = [*singles, *(f"{rule} {fence_close}" for rule in fenced)]
    if listed:
        more = json_call_object(lark, tuple(tools), arguments_key)
        alternatives.append(f"({' | '.join(listed)}) ({literal(', ')} {more})* {literal(']')}")
    return " | ".join(alternatives)
