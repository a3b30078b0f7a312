"""An incremental JSON scanner that re-emits one value as it arrives, coercing by schema where unambiguous.

It tracks the key path (object keys, array positions) so every value knows its sub-schema. Strings stream
character by character, except a string written where the schema wants a number/boolean/object/array: that
one is held until it closes and then emitted coerced (or unchanged). Numbers and literals are short and are
emitted whole. Raw control characters inside strings are escaped (the same string value, now valid JSON).
Each character is examined once: strings advance by regex search, so cost is O(1) per character.
"""

import json
import re

from exo.tool_calls.arguments.schema import (
    SchemaView,
    coerce_number,
    coerce_string,
    wants_coercion_from_string,
)

_STRING_SPECIAL = re.compile(r'["\\\x00-\x1f]')
_SCALAR_CHARS = re.compile(r"[0-9A-Za-z+\-.]*")
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_ESCAPABLE = frozenset('"\\/bfnrtu')
_WHITESPACE = " \t\n\r"

# Container states: what the next significant character may be.
_EXPECT_FIRST = 0  # after `{` / `[`: a key/value or the closing bracket
_EXPECT_KEY = 1  # after `,` in an object
_EXPECT_COLON = 2
_EXPECT_VALUE = 3  # after `:` in an object, or `,` in an array
_EXPECT_COMMA_OR_CLOSE = 4


class _Container:
    __slots__ = ("index", "is_object", "key", "schema", "state")

    def __init__(self, is_object: bool, schema: SchemaView | None) -> None:
        self.is_object = is_object
        self.schema = schema
        self.state = _EXPECT_FIRST
        self.key = ""
        self.index = 0

    def child_schema(self) -> SchemaView | None:
        if self.schema is None:
            return None
        return self.schema.property(self.key) if self.is_object else self.schema.item(self.index)


class JsonValueStreamer:
    """Consumes exactly one JSON value from a character stream and re-emits it.

    `feed` returns the position where it stopped: the end of the value (`done`), the end of the text, or
    the offending character (`error` set, character not consumed). Output accumulates until `take()`.
    """

    def __init__(self, schema: SchemaView | None) -> None:
        self._root_schema = schema
        self._stack: list[_Container] = []
        self._out: list[str] = []
        self.done = False
        self.error: str | None = None
        self._started = False
        # The token being read: None, "key", "string" (streamed), "held_string", or "scalar".
        self._token: str | None = None
        self._token_parts: list[str] = []
        self._token_schema: SchemaView | None = None
        self._escape_pending = False

    def take(self) -> str:
        """The text produced since the last call."""
        text = "".join(self._out)
        self._out.clear()
        return text

    def take_held(self) -> str:
        """Text read but not yet emitted (a held string or scalar): used when the value breaks or is cut off."""
        held = "".join(self._token_parts) if self._token in ("held_string", "scalar") else ""
        self._token_parts.clear()
        return self.take() + held

    def feed(self, text: str, position: int) -> int:
        length = len(text)
        while position < length and not self.done and self.error is None:
            if self._token in ("key", "string", "held_string"):
                position = self._read_string(text, position)
            elif self._token == "scalar":
                position = self._read_scalar(text, position)
            else:
                position = self._read_structure(text, position)
        return position

    def _emit_token_text(self, piece: str) -> None:
        if self._token == "string":
            self._out.append(piece)
        elif self._token == "key":
            self._out.append(piece)
            self._token_parts.append(piece)
        else:
            self._token_parts.append(piece)

    def _read_string(self, text: str, position: int) -> int:
        if self._escape_pending:
            character = text[position]
            if character not in _ESCAPABLE:
                self.error = f"invalid escape '\\{character}' in a string"
                return position
            self._escape_pending = False
            self._emit_token_text(character)
            return position + 1
        match = _STRING_SPECIAL.search(text, position)
        end = match.start() if match is not None else len(text)
        if end > position:
            self._emit_token_text(text[position:end])
        if match is None:
            return end
        character = match.group()
        if character == "\\":
            self._escape_pending = True
            self._emit_token_text(character)
        elif character == '"':
            self._emit_token_text(character)
            self._end_string()
        else:
            # A raw control character: the same string value, written as valid JSON.
            self._emit_token_text(json.dumps(character)[1:-1])
        return end + 1

    def _end_string(self) -> None:
        token, self._token = self._token, None
        if token == "key":
            container = self._stack[-1]
            container.key = str(json.loads("".join(self._token_parts)))
            container.state = _EXPECT_COLON
            self._token_parts.clear()
            return
        if token == "held_string" and self._token_schema is not None:
            raw = "".join(self._token_parts)
            self._token_parts.clear()
            coerced = coerce_string(str(json.loads(raw, strict=False)), self._token_schema)
            self._out.append(raw if coerced is None else json.dumps(coerced, ensure_ascii=False))
        self._end_value()

    def _read_scalar(self, text: str, position: int) -> int:
        match = _SCALAR_CHARS.match(text, position)
        end = match.end() if match is not None else position
        self._token_parts.append(text[position:end])
        if end == len(text):
            return end
        literal = "".join(self._token_parts)
        self._token_parts.clear()
        self._token = None
        if literal in ("true", "false", "null"):
            self._out.append(literal)
        elif _NUMBER.fullmatch(literal):
            self._out.append(coerce_number(literal, self._token_schema))
        else:
            self.error = f"invalid literal {literal[:40]!r}"
            self._token_parts.append(literal)
            self._token = "scalar"
            return end
        self._end_value()
        return end

    def finish_scalar_at_end(self) -> None:
        """End of input right after a number (`{"a": 1` cut off, or a bare top-level number): close it."""
        if self._token == "scalar":
            self._read_scalar(" ", 0)

    def _end_value(self) -> None:
        if not self._stack:
            self.done = True
        else:
            self._stack[-1].state = _EXPECT_COMMA_OR_CLOSE

    def _read_structure(self, text: str, position: int) -> int:
        character = text[position]
        if character in _WHITESPACE:
            if self._started:
                self._out.append(character)
            return position + 1
        container = self._stack[-1] if self._stack else None
        state = container.state if container is not None else _EXPECT_VALUE
        if container is not None and container.is_object and state in (_EXPECT_FIRST, _EXPECT_KEY):
            if character == '"':
                self._token = "key"
                self._token_parts.clear()
                self._emit_token_text(character)
                return position + 1
            if character == "}" and state == _EXPECT_FIRST:
                return self._close(position)
            self.error = f"expected a key, got {character!r}"
            return position
        if state == _EXPECT_COLON:
            if character != ":":
                self.error = f"expected ':', got {character!r}"
                return position
            assert container is not None
            container.state = _EXPECT_VALUE
            self._out.append(character)
            return position + 1
        if state == _EXPECT_COMMA_OR_CLOSE:
            assert container is not None
            if character == ",":
                if container.is_object:
                    container.state = _EXPECT_KEY
                else:
                    container.index += 1
                    container.state = _EXPECT_VALUE
                self._out.append(character)
                return position + 1
            if character == ("}" if container.is_object else "]"):
                return self._close(position)
            self.error = f"expected ',' or a closing bracket, got {character!r}"
            return position
        if character == "]" and container is not None and state == _EXPECT_FIRST:
            return self._close(position)
        return self._start_value(character, position, container)

    def _start_value(self, character: str, position: int, container: _Container | None) -> int:
        schema = container.child_schema() if container is not None else self._root_schema
        self._started = True
        if character in "{[":
            self._stack.append(_Container(character == "{", schema))
            self._out.append(character)
        elif character == '"':
            self._token = "held_string" if wants_coercion_from_string(schema) else "string"
            self._token_schema = schema
            self._token_parts.clear()
            self._emit_token_text(character)
        elif character == "-" or character.isalnum():
            self._token = "scalar"
            self._token_schema = schema
            self._token_parts.clear()
            return position
        else:
            self.error = f"unexpected {character!r} where a value should start"
            return position
        return position + 1

    def _close(self, position: int) -> int:
        self._out.append((self._stack.pop().is_object and "}") or "]")
        self._end_value()
        return position + 1
