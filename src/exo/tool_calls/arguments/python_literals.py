"""Parse pythonic calls `[f(a=1), g(b="x")]` with `ast` (never eval), and find where such a list ends."""

import ast
import re
from typing import cast

from pydantic import JsonValue as WireJsonValue

from exo.tool_calls.arguments.parsed_call import ParsedCall
from exo.tool_calls.arguments.schema import JsonValue

_JSON_NAMES = frozenset(("true", "false", "null"))
_INTERESTING = re.compile(r"""[\[\](){}'"\\]""")


def json_compatible(value: object) -> JsonValue:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [json_compatible(item) for item in cast(list[object], value)]
    if isinstance(value, dict):
        entries = cast(dict[object, object], value)
        if all(isinstance(key, str) for key in entries):
            return {str(key): json_compatible(item) for key, item in entries.items()}
    raise ValueError(f"argument value is not JSON-like: {value!r:.60}")


class _JsonLiterals(ast.NodeTransformer):
    """Templates render nested values as JSON, so `true`/`false`/`null` appear where Python has True/False/None."""

    def visit_Name(self, node: ast.Name) -> ast.expr:
        if node.id not in _JSON_NAMES:
            return node
        return ast.copy_location(ast.Constant({"true": True, "false": False, "null": None}[node.id]), node)


def _dotted_name(function: ast.expr) -> str:
    if isinstance(function, ast.Name):
        return function.id
    if isinstance(function, ast.Attribute):
        return f"{_dotted_name(function.value)}.{function.attr}"
    raise ValueError("call target is not a name")


def _call(node: ast.expr) -> ParsedCall:
    if not isinstance(node, ast.Call) or node.args:
        raise ValueError("not a call with keyword arguments only")
    arguments: dict[str, JsonValue] = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            raise ValueError("**kwargs in a tool call")
        arguments[keyword.arg] = json_compatible(ast.literal_eval(_JsonLiterals().visit(keyword.value)))
    return ParsedCall(name=_dotted_name(node.func), arguments=cast(dict[str, WireJsonValue], arguments))


def parse_pythonic_calls(text: str) -> list[ParsedCall]:
    """`[f(a=1), g(b="x")]` or a single `f(a=1)` → calls; ValueError when it is anything else."""
    try:
        body = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as error:
        raise ValueError(f"not Python syntax: {error.msg}") from error
    elements = body.elts if isinstance(body, ast.List) else [body]
    if not elements:
        raise ValueError("an empty list of calls")
    return [_call(element) for element in elements]


class BracketTracker:
    """Finds where a bracketed Python expression closes, skipping over string literals; O(1) per character."""

    def __init__(self) -> None:
        self._depth = 0
        self._quote: str | None = None
        self._escaped = False
        self.closed = False

    def feed(self, text: str, position: int) -> int:
        """Advance from `position`; return the position just after the closing bracket, or the text end."""
        while position < len(text) and not self.closed:
            if self._escaped:
                self._escaped = False
                position += 1
                continue
            match = _INTERESTING.search(text, position)
            if match is None:
                position = len(text)
                break
            character, position = match.group(), match.end()
            if character == "\\":
                self._escaped = self._quote is not None
            elif self._quote is not None:
                self._quote = None if character == self._quote else self._quote
            elif character in "'\"":
                self._quote = character
            elif character in "[({":
                self._depth += 1
            else:
                self._depth -= 1
                self.closed = self._depth <= 0
        return position
