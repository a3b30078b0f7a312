"""Lark (llguidance dialect) grammars for tool calls in each model's own format.

A call's arguments are an inline `%json` schema: each tool's schema stays a schema root of its own, so its
`$defs`/`$ref` keep working, and the fixed text around it (`{"name": "X", "arguments": `) pins the name.
Each format contributes a `reply` rule; `start` adds the optional reasoning block in front of it.
"""

import json
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Final

from llguidance import LLMatcher

from exo.shared.types.api import FunctionDefinition, JsonObject
from exo.worker.engines.mlx.constrained.spec import (
    ConstraintMode,
    ReasoningMarkers,
    ToolConstraintSpec,
    UnsupportedConstraintError,
)

HERMES_CALL_START: Final = "<tool_call>"
HERMES_CALL_END: Final = "</tool_call>"
LLAMA3_PYTHON_TAG: Final = "<|python_tag|>"
TAGGED_JSON_FORMATS: Final = frozenset({"hermes", "generic"})
LLAMA3_JSON_FORMAT: Final = "llama3_json"
SUPPORTED_FORMATS: Final = frozenset({*TAGGED_JSON_FORMATS, LLAMA3_JSON_FORMAT})

# Compact json.dumps-style separators: the spacing chat templates render, and no unbounded whitespace runs for a
# sampler to wander into.
_JSON_LAYOUT: Final[JsonObject] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_SCHEMA_COMBINATORS: Final = ("type", "anyOf", "oneOf", "allOf", "$ref", "enum", "const")
NEWLINE: Final = json.dumps("\n")
_ERROR_POSITION: Final = re.compile(r"^at \d+\(\d+\): ")
_GRAMMAR_ECHO_LINE: Final = re.compile(r"^\s*\d+ \| ")
ANY_TEXT: Final = r"TEXT: /(.|\n)*/"


def json_options(*, every_keyword_enforced: bool) -> JsonObject:
    """llguidance's `x-guidance` options for an embedded schema.

    Lenient unless `every_keyword_enforced`: keywords llguidance does not implement (uniqueItems, not,
    if/then/else, contains, propertyNames, dependentRequired, unevaluatedProperties) then go unenforced instead of
    failing the request, and everything else in the schema is still enforced. `strict: true` (a tool or a
    json_schema response format) asks for output that always validates, so there such a keyword fails instead.
    """
    return {**_JSON_LAYOUT, "lenient": not every_keyword_enforced}


def marker_texts(spec: ToolConstraintSpec) -> tuple[str, ...]:
    """Texts the grammar for `spec` writes as markers: the caller looks up which are single added tokens."""
    return format_marker_texts(spec.tool_format, spec.reasoning, with_calls=True)


def format_marker_texts(tool_format: str, reasoning: ReasoningMarkers | None, *, with_calls: bool) -> tuple[str, ...]:
    """The call markers of `tool_format` (when calls may be written) and the reasoning markers."""
    call_markers: tuple[str, ...] = ()
    if with_calls:
        tagged = tool_format in TAGGED_JSON_FORMATS
        call_markers = (HERMES_CALL_START, HERMES_CALL_END) if tagged else (LLAMA3_PYTHON_TAG,)
    reasoning_markers = (reasoning.start, reasoning.end) if reasoning else ()
    return (*call_markers, *reasoning_markers)


def build_tool_grammar(spec: ToolConstraintSpec, *, special_tokens: Mapping[str, int] | None = None) -> str:
    """The llguidance lark grammar that enforces `spec`.

    `special_tokens` maps a marker text (such as `<tool_call>`) to its token id when the tokenizer has it as one
    added token: llguidance matches such a token only by id, never by its text, so the grammar accepts both the
    token and the marker spelled out in ordinary pieces. Raises UnsupportedConstraintError for formats without a
    grammar here and for schemas llguidance cannot compile (such as a `$ref` to nowhere).
    """
    if not spec.tools:
        raise UnsupportedConstraintError("a tool-call constraint needs at least one tool")
    if spec.mode is ConstraintMode.NAMED and len(spec.tools) != 1:
        raise UnsupportedConstraintError("a named tool_choice constrains to exactly one tool")
    markers = special_tokens or {}
    if spec.tool_format in TAGGED_JSON_FORMATS:
        reply = _tagged_json_reply(spec, markers)
    elif spec.tool_format == LLAMA3_JSON_FORMAT:
        reply = _bare_json_reply(spec, markers)
    else:
        raise UnsupportedConstraintError(
            f"tool format {spec.tool_format!r} has no constraint grammar (supported: {sorted(SUPPORTED_FORMATS)})"
        )
    grammar = "\n".join(["%llguidance {}", *start_rules(spec.reasoning, markers), ANY_TEXT, *reply])
    raise_if_rejected(grammar)
    return grammar


def start_rules(reasoning: ReasoningMarkers | None, markers: Mapping[str, int]) -> list[str]:
    """`start`: the reply, after a reasoning block when the model has one (its text free, ended by its marker)."""
    if reasoning is None:
        return ["start: reply"]
    rules = [
        f"reasoning_rest: {_text_then(reasoning.end, markers, 'reasoning_end')} /\\n{{0,2}}/",
        *_text_then_rules(reasoning.end, markers, "reasoning_end"),
    ]
    if reasoning.opened_in_prompt:
        return ["start: reasoning_rest reply", *rules]
    return [f"start: ({marker_expression(reasoning.start, markers)} reasoning_rest)? reply", *rules]


def _tagged_json_reply(spec: ToolConstraintSpec, markers: Mapping[str, int]) -> list[str]:
    """Hermes/Qwen: `<tool_call>\\n{"name": …, "arguments": …}\\n</tool_call>`, calls joined by a newline."""
    single_call = spec.mode is ConstraintMode.NAMED or not spec.parallel_tool_calls
    more_calls = "" if single_call else f" ({NEWLINE} call)*"
    call_rules = tagged_call_rules(spec.tools, markers)
    if spec.mode is not ConstraintMode.STRICT_AUTO:
        return [f"reply: call{more_calls}", *call_rules]
    # Free text ends at the first marker (a lazy lexeme stops there), so text can never carry a spelled-out marker
    # past the grammar: a constrained call follows.
    return [
        f"reply: TEXT | first_call{more_calls}",
        f"first_call: {_text_then(HERMES_CALL_START, markers, 'call_start')} {NEWLINE} call_rest",
        *_text_then_rules(HERMES_CALL_START, markers, "call_start"),
        *call_rules,
    ]


def _bare_json_reply(spec: ToolConstraintSpec, markers: Mapping[str, int]) -> list[str]:
    """Llama 3.x JSON tool calling: one `{"name": …, "parameters": …}` object, optionally after the model's
    `<|python_tag|>` token where the tokenizer has one (one call: parallel calls are not part of the format)."""
    call = llama3_call(markers)
    body = body_rules(spec.tools, "parameters")
    if spec.mode is ConstraintMode.STRICT_AUTO:
        # Text that opens with "{" is a call, as Llama's own prompt format reads it.
        return [f"reply: PROSE | {call}", r"PROSE: /([^{](.|\n)*)?/", *body]
    return [f"reply: {call}", *body]


def tagged_call_rules(tools: tuple[FunctionDefinition, ...], markers: Mapping[str, int]) -> list[str]:
    """`call` (and `call_rest`, `body`): one Hermes/Qwen `<tool_call>` block naming one of `tools`."""
    return [
        f"call: {marker_expression(HERMES_CALL_START, markers)} {NEWLINE} call_rest",
        f"call_rest: body {NEWLINE} {marker_expression(HERMES_CALL_END, markers)}",
        *body_rules(tools, "arguments"),
    ]


def llama3_call(markers: Mapping[str, int]) -> str:
    """A Llama 3 call: `body` (rules from `body_rules` with "parameters"), after `<|python_tag|>` if it is a token."""
    return f"<[{markers[LLAMA3_PYTHON_TAG]}]>? body" if LLAMA3_PYTHON_TAG in markers else "body"


def body_rules(tools: tuple[FunctionDefinition, ...], arguments_key: str) -> list[str]:
    """`body` is one alternative per tool: fixed JSON text up to the arguments, the tool's schema, then `}`."""
    alternatives = [f"body_{index}" for index in range(len(tools))]
    rules = [f"body: {' | '.join(alternatives)}"]
    for rule_name, tool in zip(alternatives, tools, strict=True):
        head = "{" + json.dumps("name") + ": " + json.dumps(tool.name) + ", " + json.dumps(arguments_key) + ": "
        schema = json.dumps(_arguments_schema(tool.parameters, every_keyword_enforced=bool(tool.strict)))
        rules.append(f"{rule_name}: {literal(head)} %json {schema} {literal('}')}")
    return rules


def _arguments_schema(parameters: JsonObject, *, every_keyword_enforced: bool) -> JsonObject:
    """The tool's schema with our JSON layout options; a schema that says nothing still means an object."""
    schema = dict(parameters)
    if not any(key in schema for key in _SCHEMA_COMBINATORS):
        schema["type"] = "object"
    schema["x-guidance"] = json_options(every_keyword_enforced=every_keyword_enforced)
    return schema


def _text_then(marker: str, markers: Mapping[str, int], name: str) -> str:
    """Reference to free text ended by the first `marker` (rules from `_text_then_rules` with the same name)."""
    return f"(text_then_{name} | text_then_{name}_token)" if marker in markers else f"text_then_{name}"


def _text_then_rules(marker: str, markers: Mapping[str, int], name: str) -> list[str]:
    rules = [f"text_then_{name}[lazy]: TEXT {literal(marker)}"]
    if marker in markers:
        # An added token cannot occur inside TEXT, so it ends the text by itself.
        rules.append(f"text_then_{name}_token: TEXT <[{markers[marker]}]>")
    return rules


def marker_expression(text: str, markers: Mapping[str, int]) -> str:
    """A marker written as its added token (by id) or as plain text pieces."""
    if text in markers:
        return f"(<[{markers[text]}]> | {literal(text)})"
    return literal(text)


def literal(text: str) -> str:
    """A lark string literal; JSON string escapes are what llguidance's lark reader understands."""
    return json.dumps(text, ensure_ascii=False)


@lru_cache(maxsize=64)
def raise_if_rejected(grammar: str, subject: str = "the tool-call grammar") -> None:
    """Compile the grammar once without a tokenizer so what llguidance cannot compile fails here, clearly."""
    is_error, messages = LLMatcher.validate_grammar_with_warnings(LLMatcher.grammar_from_lark(grammar))
    if is_error:
        reasons = "; ".join(_without_grammar_echo(message) for message in messages)
        raise UnsupportedConstraintError(f"llguidance rejects {subject}: {reasons}")


def _without_grammar_echo(message: str) -> str:
    """llguidance's message minus its position prefix ("at 2(8): ") and its echo of the grammar, which repeats
    every schema in full: what is left names the problem and fits in an error response."""
    lines: list[str] = []
    for line in _ERROR_POSITION.sub("", message).splitlines():
        if _GRAMMAR_ECHO_LINE.match(line):
            break
        lines.append(line.strip())
    return " ".join(line for line in lines if line)
