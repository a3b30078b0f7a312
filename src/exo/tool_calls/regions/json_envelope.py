"""JSON call objects `{"name": ..., "arguments": {...}}` (hermes, llama3, mistral lists, raw JSON), streamed.

The arguments stream as soon as the name is known and valid; a call whose arguments come before its name is
held until the name arrives. `parameters` is accepted for `arguments`, and arguments written as a JSON string
are decoded. With `strict_shape` (raw JSON with no marker) any other key means "not a call", and text refused before a
"name"/"arguments"/"parameters" key is declined (ordinary content) rather than a failed call.
"""

import json

from exo.shared.types.tool_spec import ToolSpec
from exo.tool_calls.arguments.json_stream import JsonValueStreamer
from exo.tool_calls.arguments.schema import SchemaView
from exo.tool_calls.format import CallSink

_WHITESPACE = " \t\n\r"
_ARGUMENT_KEYS = ("arguments", "parameters")
# Llama 3.x sometimes writes `{"type": "function", "name": …}`: "type" is allowed even in strict shape.
_STRICT_KEYS = ("name", "type", *_ARGUMENT_KEYS)

_EXPECT_OPEN = "open"
_EXPECT_FIRST_KEY = "first_key"
_EXPECT_KEY = "key"
_IN_KEY = "in_key"
_EXPECT_COLON = "colon"
_VALUE_START = "value_start"
_IN_VALUE = "in_value"
_AFTER_VALUE = "after_value"


class EnvelopeParser:
    """Reads one call object; `finished` when it closed, `broken` when committed arguments stopped being JSON."""

    def __init__(self, sink: CallSink, *, strict_shape: bool) -> None:
        self._sink = sink
        self._strict = strict_shape
        self.finished = False
        self.broken = False
        self._state = _EXPECT_OPEN
        self._streamer: JsonValueStreamer | None = None
        self._key = ""
        self._value_kind = ""  # "name", "arguments", "string_arguments", "held_arguments", "skip"
        self._tool: ToolSpec | None = None
        self._committed = False
        self._arguments_written = False
        self._held_arguments: str | None = None
        self._call_key_seen = False

    def feed(self, text: str, position: int) -> int:
        while position < len(text) and not (self.finished or self.broken or self._sink.paused):
            if self._state in (_IN_KEY, _IN_VALUE):
                position = self._feed_streamer(text, position)
                continue
            character = text[position]
            if character in _WHITESPACE:
                position += 1
                continue
            position = self._structure(character, position)
        return position

    def _structure(self, character: str, position: int) -> int:
        state = self._state
        if state == _EXPECT_OPEN:
            if character != "{":
                self._refuse(f"expected '{{' to open a tool call, got {character!r}")
                return position
            self._state = _EXPECT_FIRST_KEY
        elif state in (_EXPECT_FIRST_KEY, _EXPECT_KEY) and character == '"':
            self._state = _IN_KEY
            self._streamer = JsonValueStreamer(None)
            return position
        elif state in (_EXPECT_FIRST_KEY, _AFTER_VALUE) and character == "}":
            self._close_envelope()
        elif state == _EXPECT_COLON and character == ":":
            self._begin_value()
        elif state == _VALUE_START:
            self._start_value(character)
            return position
        elif state == _AFTER_VALUE and character == ",":
            self._state = _EXPECT_KEY
        elif self._committed:
            # Arguments are complete; stray text after them is for the region to deal with.
            self._sink.note_failure(f"unexpected {character!r} after the tool call's arguments")
            self._finish_committed()
            return position
        else:
            self._refuse(f"malformed tool call: unexpected {character!r}")
            return position
        return position + 1

    def _refuse(self, reason: str) -> None:
        """Give the text back as content: a failed call, or (bare, before any call key) never a call at all."""
        if self._strict and not self._call_key_seen:
            self._sink.decline()
        else:
            self._sink.reject(reason)

    def _feed_streamer(self, text: str, position: int) -> int:
        streamer = self._streamer
        assert streamer is not None
        position = streamer.feed(text, position)
        if self._value_kind == "arguments" and self._state == _IN_VALUE:
            self._sink.arguments(streamer.take())
        if streamer.error is not None:
            self._on_streamer_error(streamer, streamer.error)
        elif streamer.done:
            self._on_streamer_done(streamer)
        return position

    def _on_streamer_error(self, streamer: JsonValueStreamer, error: str) -> None:
        if self._state == _IN_VALUE and self._value_kind in ("arguments", "string_arguments"):
            self._sink.arguments(streamer.take_held())
            self._sink.note_failure(f"tool call arguments stopped being JSON: {error}")
            self.broken = True
        elif self._committed:
            self._sink.note_failure(f"malformed tool call after its arguments: {error}")
            self._finish_committed()
        else:
            self._refuse(f"malformed tool call: {error}")

    def _on_streamer_done(self, streamer: JsonValueStreamer) -> None:
        raw = streamer.take()
        if self._state == _IN_KEY:
            self._key = str(json.loads(raw))
            self._state = _EXPECT_COLON
            return
        self._state = _AFTER_VALUE
        kind = self._value_kind
        if kind == "name":
            self._on_name(json.loads(raw))
        elif kind == "held_arguments":
            self._held_arguments = raw
            if self._tool is not None:
                self._commit()
        elif kind == "string_arguments":
            self._emit_whole_arguments(str(json.loads(raw, strict=False)), fallback=raw)

    def _begin_value(self) -> None:
        key = self._key
        # Once committed the call stands: a key after its arguments (an "id") is skipped, as without strict shape.
        if self._strict and not self._committed and key not in _STRICT_KEYS:
            self._refuse(f"not a tool call: key {key!r}")
            return
        self._call_key_seen = self._call_key_seen or key in ("name", *_ARGUMENT_KEYS)
        if key == "name" and self._tool is None:
            self._value_kind = "name"
        elif key in _ARGUMENT_KEYS and self._tool is not None and not self._arguments_written:
            self._commit()
            self._value_kind = "arguments"
        elif key in _ARGUMENT_KEYS and self._held_arguments is None and not self._arguments_written:
            self._value_kind = "held_arguments"
        else:
            self._value_kind = "skip"
        self._state = _VALUE_START

    def _start_value(self, character: str) -> None:
        """The value's first character picks its scanner: string arguments are held and decoded."""
        schema: SchemaView | None = None
        if self._value_kind == "arguments":
            assert self._tool is not None
            self._arguments_written = True
            if character == '"':
                self._value_kind = "string_arguments"
            elif character == "n":
                # `"arguments": null` means no arguments: written as {} when the object closes.
                self._arguments_written = False
                self._value_kind = "skip"
            else:
                schema = SchemaView.of_tool(self._tool.parameters)
        self._streamer = JsonValueStreamer(schema)
        self._state = _IN_VALUE

    def _on_name(self, name: object) -> None:
        if not isinstance(name, str):
            self._refuse("tool call name is not a string")
            return
        tool = self._sink.find_tool(name)
        if tool is None:
            self._refuse(f"unknown tool {name!r}")
            return
        self._tool = tool
        if self._held_arguments is not None:
            self._commit()

    def _commit(self) -> None:
        assert self._tool is not None
        if not self._committed:
            self._committed = True
            self._sink.open_call(self._tool)
        if self._held_arguments is not None:
            held, self._held_arguments = self._held_arguments, None
            self._emit_whole_arguments(held, fallback=held)

    def _emit_whole_arguments(self, text: str, *, fallback: str) -> None:
        """Arguments known in full (held, or decoded from a JSON string): scan them with the schema at once."""
        assert self._tool is not None
        streamer = JsonValueStreamer(SchemaView.of_tool(self._tool.parameters))
        end = streamer.feed(text, 0)
        if streamer.done and not text[end:].strip():
            self._sink.arguments(streamer.take())
        else:
            self._sink.note_failure("tool call arguments are not a JSON value")
            self._sink.arguments(fallback)
        self._arguments_written = True

    def _close_envelope(self) -> None:
        if self._tool is None:
            self._refuse("tool call has no name")
            return
        self._commit()
        self._finish_committed()

    def _finish_committed(self) -> None:
        if not self._arguments_written:
            self._sink.arguments("{}")
            self._arguments_written = True
        self.finished = True
        self._sink.close_call()

    def finish(self) -> None:
        """Generation ended inside this object."""
        if self.finished or self.broken:
            return
        if not self._committed:
            self._refuse("generation ended inside a tool call, before its name and arguments")
            return
        if self._state == _IN_VALUE and self._value_kind in ("arguments", "string_arguments") and self._streamer:
            self._streamer.finish_scalar_at_end()
            self._sink.arguments(self._streamer.take_held())
            if not self._streamer.done:
                self._sink.note_failure("generation ended inside the tool call's arguments")
        self._finish_committed()
