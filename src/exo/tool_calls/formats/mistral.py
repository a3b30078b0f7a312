"""Mistral `[TOOL_CALLS]`: the JSON-list form `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` and the
header form `[TOOL_CALLS]name[ARGS]{...}` (optionally `name[CALL_ID]id[ARGS]{...}`), arguments streamed."""

import re

from exo.tool_calls.arguments.json_stream import JsonValueStreamer
from exo.tool_calls.arguments.schema import SchemaView
from exo.tool_calls.format import CallRegion, CallSink, MarkedFormat
from exo.tool_calls.grammar.json_calls import json_call_object, named_json_arguments
from exo.tool_calls.grammar.lark import LarkWriter, literal
from exo.tool_calls.grammar.reply import OpenedCallsGrammar, ReplyRequest, repeated
from exo.tool_calls.markers import LiteralMatcher, MarkerScanner
from exo.tool_calls.regions.json_call_region import JsonCallRegion

_START = "[TOOL_CALLS]"
_ARGS = "[ARGS]"
_NAME_CHARACTERS = re.compile(r"[\w.\-]*")
_LONGEST_NAME = 256
_WHITESPACE = " \t\n\r"


class MistralHeaderRegion:
    """`name[ARGS]{...}` after `[TOOL_CALLS]`, or a JSON list (delegated to JsonCallRegion)."""

    def __init__(self, sink: CallSink) -> None:
        self._sink = sink
        self._list: JsonCallRegion | None = None
        self._name_parts: list[str] = []
        self._started = False
        self._header: LiteralMatcher | None = None
        self._in_call_id = False
        self._arguments: JsonValueStreamer | None = None
        self._verbatim: MarkerScanner | None = None
        self._finished = False
        self._handoff: str | None = None

    @property
    def finished(self) -> bool:
        return self._finished or (self._list is not None and self._list.finished)

    @property
    def handoff_marker(self) -> str | None:
        return self._list.handoff_marker if self._list is not None else self._handoff

    def feed(self, text: str, position: int) -> int:
        while position < len(text) and not (self.finished or self._sink.paused):
            if self._list is not None:
                return self._list.feed(text, position)
            if self._verbatim is not None:
                position = self._feed_verbatim(text, position)
            elif self._arguments is not None:
                position = self._feed_arguments(self._arguments, text, position)
            elif self._header is not None:
                position = self._feed_header(self._header, text, position)
            else:
                position = self._feed_name(text, position)
        return position

    def _feed_name(self, text: str, position: int) -> int:
        if not self._started:
            if text[position] in _WHITESPACE:
                return position + 1
            self._started = True
            if text[position] == "[":
                self._list = JsonCallRegion(
                    self._sink, shape="list", strict_shape=False, end_markers=(), start_markers=(_START,)
                )
                return position
        match = _NAME_CHARACTERS.match(text, position)
        end = match.end() if match is not None else position
        self._name_parts.append(text[position:end])
        if end < len(text):
            if text[end] != "[" or not "".join(self._name_parts) or end - position > _LONGEST_NAME:
                self._sink.reject("expected `name[ARGS]` after [TOOL_CALLS]")
                return end
            self._header = LiteralMatcher(("[ARGS]", "[CALL_ID]"))
        return end

    def _feed_header(self, header: LiteralMatcher, text: str, position: int) -> int:
        if self._in_call_id and header.partial == "":
            # Skip the model's call id: ours are generated so they stay unique across turns.
            while position < len(text) and text[position] != "[":
                position += 1
            if position == len(text):
                return position
        status, position = header.step(text, position)
        if status == LiteralMatcher.MISMATCH:
            self._sink.reject("expected [ARGS] after a Mistral tool name")
        elif status == LiteralMatcher.MATCHED and header.partial == "[CALL_ID]":
            self._in_call_id = True
            self._header = LiteralMatcher(("[ARGS]",))
        elif status == LiteralMatcher.MATCHED:
            name = "".join(self._name_parts)
            tool = self._sink.find_tool(name)
            if tool is None:
                self._sink.reject(f"unknown tool {name!r}")
            else:
                self._sink.open_call(tool)
                self._arguments = JsonValueStreamer(SchemaView.of_tool(tool.parameters))
        return position

    def _feed_arguments(self, streamer: JsonValueStreamer, text: str, position: int) -> int:
        position = streamer.feed(text, position)
        self._sink.arguments(streamer.take())
        if streamer.error is not None:
            self._sink.arguments(streamer.take_held())
            self._sink.note_failure(f"tool call arguments stopped being JSON: {streamer.error}")
            self._verbatim = MarkerScanner((_START,))
        elif streamer.done:
            self._finished = True
            self._sink.close_call()
        return position

    def _feed_verbatim(self, text: str, position: int) -> int:
        assert self._verbatim is not None
        result = self._verbatim.scan(text, position)
        self._sink.arguments(result.released)
        if result.marker is not None:
            self._handoff = result.marker
            self._finished = True
            self._sink.close_call()
        return result.position

    def finish(self) -> None:
        """Generation ended inside the region."""
        if self._list is not None:
            self._list.finish()
        elif self._verbatim is not None:
            self._sink.arguments(self._verbatim.flush())
            self._sink.close_call()
        elif self._arguments is not None:
            self._arguments.finish_scalar_at_end()
            self._sink.arguments(self._arguments.take_held())
            if not self._arguments.done:
                self._sink.note_failure("generation ended inside the tool call's arguments")
            self._sink.close_call()
        else:
            self._sink.reject("generation ended inside a Mistral tool call header")
        self._finished = True


class MistralGrammar(OpenedCallsGrammar):
    """`[TOOL_CALLS]name[ARGS]{...}` per call where the tokenizer has `[ARGS]` as a token (Mistral's v11+ tokenizers:
    Small 3.2, Devstral, Magistral), else the list form `[TOOL_CALLS][{"name": …, "arguments": …}, …]` (v3)."""

    opening = _START
    markers = (_START, _ARGS)

    def after_opening(self, lark: LarkWriter, request: ReplyRequest, /) -> str:
        if _ARGS in lark.special_tokens:
            call = named_json_arguments(lark, request.tools, f"{{name}} {lark.marker(_ARGS)} {{arguments}}")
            return repeated(lark, call, lark.marker(_START), parallel=request.parallel)
        listed = repeated(lark, json_call_object(lark, request.tools), literal(", "), parallel=request.parallel)
        return f"{literal(' ')}? {literal('[')} {listed} {literal(']')}"


class MistralFormat(MarkedFormat):
    start_markers: tuple[str, ...] = (_START,)
    grammar = MistralGrammar()

    def open_region(self, _marker: str, sink: CallSink, /) -> CallRegion:
        return MistralHeaderRegion(sink)
