"""Lark (llguidance dialect) grammars for tool calls in each model's own format.

A call's arguments are an inline `%json` schema: each tool's schema stays a schema root of its own, so its
`$defs`/`$ref` keep working, and the fixed text around it (`{"name": "X", "arguments": `) pins the name.
"""

import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Final

from llguidance import LLMatcher

from exo.shared.types.api import FunctionDefinition, JsonObject
from exo.worker.engines.mlx.constrained.spec import ConstraintMode, ToolConstraintSpec, UnsupportedConstraintError

HERMES_CALL_START: Final = "<tool_call>"
HERMES_CALL_END: Final = "</tool_call>"
_TAGGED_JSON_FORMATS: Final = frozenset({"hermes", "generic"})
_LLAMA3_JSON_FORMAT: Final = "llama3_json"
SUPPORTED_FORMATS: Final = frozenset({*_TAGGED_JSON_FORMATS, _LLAMA3_JSON_FORMAT})

# Compact, json.dumps-style separators: the spacing chat templates render, and no unbounded whitespace runs for a
# sampler to wander into.
_JSON_OPTIONS: Final[JsonObject] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_SCHEMA_COMBINATORS: Final = ("type", "anyOf", "oneOf", "allOf", "$ref", "enum", "const")


def build_tool_grammar(spec: ToolConstraintSpec, *, special_tokens: Mapping[str, int] | None = None) -> str:
    """The llguidance lark grammar that enforces `spec`.

    `special_tokens` maps a marker text (such as `<tool_call>`) to its token id when the tokenizer has it as one
    added token: llguidance matches such a token only by id, never by its text, so the grammar accepts both the
    token and the marker spelled out in ordinary pieces. Raises UnsupportedConstraintError for formats without a
    grammar here and for schemas llguidance rejects.
    """
    if not spec.tools:
        raise UnsupportedConstraintError("a tool-call constraint needs at least one tool")
    if spec.mode is ConstraintMode.NAMED and len(spec.tools) != 1:
        raise UnsupportedConstraintError("a named tool_choice constrains to exactly one tool")
    markers = special_tokens or {}
    if spec.tool_format in _TAGGED_JSON_FORMATS:
        grammar = _tagged_json_grammar(spec, markers, body_key="arguments")
    elif spec.tool_format == _LLAMA3_JSON_FORMAT:
        grammar = _bare_json_grammar(spec)
    else:
        raise UnsupportedConstraintError(
            f"tool format {spec.tool_format!r} has no constraint grammar (supported: {sorted(SUPPORTED_FORMATS)})"
        )
    _raise_if_rejected(grammar)
    return grammar


def _tagged_json_grammar(spec: ToolConstraintSpec, markers: Mapping[str, int], *, body_key: str) -> str:
    """Hermes/Qwen: `<tool_call>\\n{"name": …, "arguments": …}\\n</tool_call>`, calls joined by a newline."""
    single_call = spec.mode is ConstraintMode.NAMED or not spec.parallel_tool_calls
    more_calls = "" if single_call else ' ("\\n" call)*'
    newline = _literal("\n")
    call_rules = [
        f"call: open_marker {newline} call_rest",
        f"call_rest: body {newline} close_marker",
        f"open_marker: {_marker(HERMES_CALL_START, markers)}",
        f"close_marker: {_marker(HERMES_CALL_END, markers)}",
        *_body_rules(spec.tools, body_key),
    ]
    if spec.mode is not ConstraintMode.STRICT_AUTO:
        return "\n".join(["%llguidance {}", f"start: call{more_calls}", *call_rules])
    # Free text ends at the first marker: the lazy lexeme stops there, so text can never carry a spelled-out
    # marker past the grammar, and a constrained call follows. An added marker token ends the text by itself.
    openings = ["text_then_open"]
    opening_rules = [f"text_then_open[lazy]: TEXT {_literal(HERMES_CALL_START)}"]
    if HERMES_CALL_START in markers:
        openings.append("text_then_open_token")
        opening_rules.append(f"text_then_open_token: TEXT <[{markers[HERMES_CALL_START]}]>")
    return "\n".join(
        [
            "%llguidance {}",
            f"start: TEXT | first_call{more_calls}",
            f"first_call: ({' | '.join(openings)}) {newline} call_rest",
            r"TEXT: /(.|\n)*/",
            *opening_rules,
            *call_rules,
        ]
    )


def _bare_json_grammar(spec: ToolConstraintSpec) -> str:
    """Llama 3.x JSON tool calling: one `{"name": …, "parameters": …}` object (the format has no parallel calls)."""
    lines = _body_rules(spec.tools, "parameters")
    if spec.mode is ConstraintMode.STRICT_AUTO:
        # Text that opens with "{" is a call, as Llama's own prompt format reads it.
        return "\n".join(["%llguidance {}", "start: TEXT | body", r"TEXT: /([^{](.|\n)*)?/", *lines])
    return "\n".join(["%llguidance {}", "start: body", *lines])


def _body_rules(tools: tuple[FunctionDefinition, ...], body_key: str) -> list[str]:
    """`body` is one alternative per tool: fixed JSON text up to the arguments, the tool's schema, then `}`."""
    alternatives = [f"body_{index}" for index in range(len(tools))]
    rules = [f"body: {' | '.join(alternatives)}"]
    for rule_name, tool in zip(alternatives, tools, strict=True):
        head = "{" + json.dumps("name") + ": " + json.dumps(tool.name) + ", " + json.dumps(body_key) + ": "
        schema = json.dumps(_arguments_schema(tool.parameters))
        rules.append(f"{rule_name}: {_literal(head)} %json {schema} {_literal('}')}")
    return rules


def _arguments_schema(parameters: JsonObject) -> JsonObject:
    """The tool's schema with our JSON layout options; a schema that says nothing still means an object."""
    schema = dict(parameters)
    if not any(key in schema for key in _SCHEMA_COMBINATORS):
        schema["type"] = "object"
    schema["x-guidance"] = _JSON_OPTIONS
    return schema


def _marker(text: str, markers: Mapping[str, int]) -> str:
    """A marker written as its added token (by id) or as plain text pieces."""
    if text in markers:
        return f"(<[{markers[text]}]> | {_literal(text)})"
    return _literal(text)


def _literal(text: str) -> str:
    """A lark string literal; JSON string escapes are what llguidance's lark reader understands."""
    return json.dumps(text, ensure_ascii=False)


@lru_cache(maxsize=64)
def _raise_if_rejected(grammar: str) -> None:
    """Compile the grammar once without a tokenizer so schema features llguidance lacks fail here, clearly."""
    is_error, messages = LLMatcher.validate_grammar_with_warnings(LLMatcher.grammar_from_lark(grammar))
    if is_error:
        raise UnsupportedConstraintError(f"llguidance rejects the tool-call grammar: {'; '.join(messages)}")
