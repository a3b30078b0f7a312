"""Gemma's calls, streamed: `call:NAME{key:QUOTEtextQUOTE,count:3}` between a start and an end marker, where
QUOTE is the family's string delimiter (Gemma 4 `<|"|>`, FunctionGemma `<escape>`). Keys are bare; a quoted value
is a string (streamed character by character); any other value is JSON text, read with the tool's schema."""

import json
import re
from dataclasses import dataclass

from exo.tool_calls.arguments.json_stream import JsonValueStreamer
from exo.tool_calls.arguments.schema import SchemaView
from exo.tool_calls.format import CallSink
from exo.tool_calls.markers import LiteralMatcher, MarkerScanner

_NAME_CHARACTERS = re.compile(r"[\w.\-]*")
_LONGEST_NAME = 256
_WHITESPACE = " \t\n\r"


@dataclass(frozen=True)
class BracedSyntax:
    quote: str
    end: str


_PREFIX = "prefix"  # `call:`
_NAME = "name"
_KEY = "key"  # expecting a key or `}`
_COLON = "colon"
_VALUE_START = "value_start"
_STRING = "string"
_JSON = "json"
_AFTER_VALUE = "after_value"  # `,` or `}`
_END = "end"  # the end marker


class BracedCallRegion:
    """One `call:NAME{…}` after the format's start marker, up to its end marker."""

    def __init__(self, sink: CallSink, syntax: BracedSyntax) -> None:
        self._sink = sink
        self._syntax = syntax
        self._state = _PREFIX
        self._matcher = LiteralMatcher(("call:",))
        self._parts: list[str] = []
        self._schema: SchemaView | None = None
        self._member_schema: SchemaView | None = None
        self._members = 0
        self._string = MarkerScanner((syntax.quote,))
        self._json: JsonValueStreamer | None = None
        self._finished = False

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def handoff_marker(self) -> str | None:
        return None

    def feed(self, text: str, position: int) -> int:
        while position < len(text) and not (self._finished or self._sink.paused):
            state = self._state
            if state in (_NAME, _KEY):
                position = self._feed_word(text, position)
            elif state == _STRING:
                position = self._feed_string(text, position)
            elif state == _JSON:
                position = self._feed_json(text, position)
            elif state in (_PREFIX, _END, _VALUE_START) and (
                self._matcher.partial or text[position] not in _WHITESPACE
            ):
                position = self._feed_literal(text, position)
            elif state in (_COLON, _AFTER_VALUE) and text[position] not in _WHITESPACE:
                position = self._feed_punctuation(text[position], position)
            else:
                position += 1
        return position

    def _feed_literal(self, text: str, position: int) -> int:
        status, position = self._matcher.step(text, position)
        if status == LiteralMatcher.PENDING:
            return position
        matched = status == LiteralMatcher.MATCHED
        self._matcher.partial = ""
        if self._state == _PREFIX:
            if matched:
                self._state = _NAME
            else:
                self._sink.reject("expected `call:NAME{…}` after the tool-call marker")
        elif self._state == _VALUE_START:
            if matched:
                self._sink.arguments('"')
                self._state = _STRING
            else:
                self._json = JsonValueStreamer(self._member_schema)
                self._state = _JSON
        else:
            if not matched:
                self._sink.note_failure(f"expected {self._syntax.end!r} after a tool call")
            self._finished = True
        return position

    def _feed_word(self, text: str, position: int) -> int:
        match = _NAME_CHARACTERS.match(text, position)
        end = match.end() if match is not None else position
        self._parts.append(text[position:end])
        if end == len(text):
            return end
        word = "".join(self._parts)
        self._parts.clear()
        if self._state == _NAME:
            return self._open(word, text[end], end)
        if word:
            self._key(word)
            return end
        if text[end] in _WHITESPACE:
            return end + 1
        if text[end] == "}" and self._members == 0:
            self._close()
            return end + 1
        self._sink.note_failure(f"unexpected {text[end]!r} where a key should start")
        self._close()
        return end

    def _open(self, name: str, following: str, end: int) -> int:
        tool = self._sink.find_tool(name) if following == "{" and len(name) <= _LONGEST_NAME else None
        if tool is None:
            self._sink.reject(f"unknown tool {name!r}" if following == "{" else "malformed `call:NAME{…}`")
            return end
        self._sink.open_call(tool)
        self._schema = SchemaView.of_tool(tool.parameters)
        self._state = _KEY
        return end + 1

    def _key(self, key: str) -> None:
        self._member_schema = self._schema.property(key) if self._schema is not None else None
        opening = "{" if self._members == 0 else ", "
        self._members += 1
        self._sink.arguments(f"{opening}{json.dumps(key, ensure_ascii=False)}: ")
        self._state = _COLON

    def _feed_punctuation(self, character: str, position: int) -> int:
        if self._state == _COLON and character == ":":
            self._state = _VALUE_START
            self._matcher = LiteralMatcher((self._syntax.quote,))
            return position + 1
        if self._state == _AFTER_VALUE and character == ",":
            self._state = _KEY
            return position + 1
        if self._state == _AFTER_VALUE and character == "}":
            self._close()
            return position + 1
        self._sink.note_failure(f"unexpected {character!r} in a tool call's arguments")
        self._close()
        return position

    def _feed_string(self, text: str, position: int) -> int:
        result = self._string.scan(text, position)
        if result.released:
            self._sink.arguments(json.dumps(result.released, ensure_ascii=False)[1:-1])
        if result.marker is not None:
            self._sink.arguments('"')
            self._state = _AFTER_VALUE
        return result.position

    def _feed_json(self, text: str, position: int) -> int:
        streamer = self._json
        assert streamer is not None
        position = streamer.feed(text, position)
        self._sink.arguments(streamer.take())
        if streamer.error is not None:
            self._sink.arguments(streamer.take_held())
            self._sink.note_failure(f"a tool call argument is not a value: {streamer.error}")
            self._close()
        elif streamer.done:
            self._state = _AFTER_VALUE
        return position

    def _close(self) -> None:
        self._sink.arguments("}" if self._members else "{}")
        self._sink.close_call()
        self._state = _END
        self._matcher = LiteralMatcher((self._syntax.end,))

    def finish(self) -> None:
        """Generation ended inside the region (EOS often replaces the end marker)."""
        if self._state in (_PREFIX, _NAME):
            self._sink.reject("generation ended inside a tool call, before its name")
        elif self._state != _END:
            if self._state == _JSON and self._json is not None:
                self._json.finish_scalar_at_end()
                self._sink.arguments(self._json.take_held())
            self._sink.note_failure("generation ended inside the tool call")
            self._sink.close_call()
        self._finished = True
