"""Writing llguidance lark grammars: rule names, markers that may be added tokens, free text, embedded schemas."""

import json
import re
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Final

from llguidance import LLMatcher
from pydantic import JsonValue

from exo.tool_calls.grammar.spec import UnsupportedConstraintError

JsonObject = dict[str, JsonValue]

# Compact json.dumps-style separators: the spacing chat templates render, and no unbounded whitespace runs for a
# sampler to wander into.
_JSON_LAYOUT: Final[JsonObject] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_SCHEMA_COMBINATORS: Final = ("type", "anyOf", "oneOf", "allOf", "$ref", "enum", "const")
_ANY_TEXT: Final = r"(.|\n)*"
_ERROR_POSITION: Final = re.compile(r"^at \d+\(\d+\): ")
_GRAMMAR_ECHO_LINE: Final = re.compile(r"^\s*\d+ \| ")


def json_options(*, every_keyword_enforced: bool) -> JsonObject:
    """llguidance's `x-guidance` options for an embedded schema.

    Lenient unless `every_keyword_enforced`: keywords llguidance does not implement (uniqueItems, not,
    if/then/else, contains, propertyNames, dependentRequired, unevaluatedProperties) then go unenforced instead of
    failing the request, and everything else in the schema is still enforced. `strict: true` (a tool or a
    json_schema response format) asks for output that always validates, so there such a keyword fails instead.
    """
    return {**_JSON_LAYOUT, "lenient": not every_keyword_enforced}


def arguments_schema(parameters: Mapping[str, JsonValue], *, every_keyword_enforced: bool) -> JsonObject:
    """A tool's parameters schema with our JSON layout options; a schema that says nothing still means an object."""
    schema = dict(parameters)
    if not any(key in schema for key in _SCHEMA_COMBINATORS):
        schema["type"] = "object"
    schema["x-guidance"] = json_options(every_keyword_enforced=every_keyword_enforced)
    return schema


def literal(text: str) -> str:
    """A lark string literal; JSON string escapes are what llguidance's lark reader understands."""
    return json.dumps(text, ensure_ascii=False)


def _regex_literal(text: str) -> str:
    """`text` as a piece of a lark regex (between slashes)."""
    return re.escape(text).replace("/", "\\/")


class LarkWriter:
    """Collects the rules of one grammar. `special_tokens` maps marker texts that are single added tokens to their
    ids: llguidance matches such a token only by id, never by its text, so a marker is written as either."""

    def __init__(self, special_tokens: Mapping[str, int]) -> None:
        self.special_tokens: Final = special_tokens
        self._rules: list[str] = []
        self._used: set[str] = set()

    def rule(self, hint: str, body: str, *, lazy: bool = False) -> str:
        """Add `name: body` under a fresh name derived from `hint`; returns the name."""
        name = self._fresh_rule_name(hint)
        self._rules.append(f"{name}{'[lazy]' if lazy else ''}: {body}")
        return name

    def recursive_rule(self, hint: str, body: Callable[[str], str]) -> str:
        """As `rule`, for a body that refers to the rule itself: `body` is given the rule's name."""
        name = self._fresh_rule_name(hint)
        self._rules.append(f"{name}: {body(name)}")
        return name

    def _fresh_rule_name(self, hint: str) -> str:
        base = re.sub(r"[^a-z0-9_]", "_", hint.lower()).strip("_") or "rule"
        name, counter = base, 0
        while name in self._used:
            counter += 1
            name = f"{base}_{counter}"
        self._used.add(name)
        return name

    def _terminal(self, hint: str, body: str) -> str:
        base = re.sub(r"[^A-Z0-9_]", "_", hint.upper()).strip("_") or "TERM"
        name, counter = base, 0
        while name in self._used:
            counter += 1
            name = f"{base}_{counter}"
        self._used.add(name)
        self._rules.append(f"{name}: {body}")
        return name

    def marker(self, text: str) -> str:
        """A marker written as its added token (by id) or as plain text pieces."""
        if text in self.special_tokens:
            return f"(<[{self.special_tokens[text]}]> | {literal(text)})"
        return literal(text)

    def text_until(self, end: str, hint: str = "text", *, never_starting: Sequence[str] = ()) -> str:
        """Free text ended by the first `end` (included): a lazy lexeme, or the added token when `end` is one.

        `never_starting` (regex pieces, leading whitespace allowed) keeps the text from beginning like another
        alternative's opening lexeme, which this still-growing lexeme would otherwise swallow."""
        free_text = f"/{_ANY_TEXT}/" + "".join(f" & ~/{pattern}/" for pattern in _starting(never_starting))
        if never_starting:
            free_text = self._terminal(f"{hint}_start", free_text)
        text = self.rule(f"{hint}_then_text", f"{free_text} {literal(end)}", lazy=True)
        if end not in self.special_tokens:
            return text
        free = self._terminal(f"{hint}_free", free_text)
        return f"({text} | {free} <[{self.special_tokens[end]}]>)"

    def prose(self, *, never_containing: Sequence[str] = (), never_starting: Sequence[str] = ()) -> str:
        """A terminal for free text that contains none of `never_containing` (texts) and starts with none of
        `never_starting` (regex pieces, leading whitespace allowed). Added tokens never match free text anyway."""
        excluded = [f"{_ANY_TEXT}{_regex_literal(text)}{_ANY_TEXT}" for text in never_containing]
        excluded += _starting(never_starting)
        body = f"/{_ANY_TEXT}/" + "".join(f" & ~/{pattern}/" for pattern in excluded)
        return self._terminal("prose", body)

    def json_value(self, schema: Mapping[str, JsonValue], *, every_keyword_enforced: bool) -> str:
        """An embedded JSON value valid against `schema` (its own root, so local `$ref`s resolve)."""
        options = json_options(every_keyword_enforced=every_keyword_enforced)
        return f"%json {json.dumps({**schema, 'x-guidance': options}, ensure_ascii=False)}"

    def arguments(self, parameters: Mapping[str, JsonValue], *, every_keyword_enforced: bool) -> str:
        """A JSON arguments object valid against a tool's `parameters`."""
        schema = arguments_schema(parameters, every_keyword_enforced=every_keyword_enforced)
        return f"%json {json.dumps(schema, ensure_ascii=False)}"

    def grammar(self, start: str) -> str:
        """The whole grammar: `start` (an expression) and every rule written so far."""
        return "\n".join(["%llguidance {}", f"start: {start}", *self._rules])


def _starting(pieces: Sequence[str]) -> list[str]:
    """Regexes of the texts that begin (after whitespace) with one of `pieces`."""
    return [rf"[ \t\r\n]*{start}{_ANY_TEXT}" for start in pieces]


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
