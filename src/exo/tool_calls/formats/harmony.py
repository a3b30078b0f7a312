"""GPT-OSS harmony: every message is `<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>json]<|message|>TEXT` ended
by `<|end|>` (the next one opening with `<|start|>assistant`), `<|call|>` or `<|return|>` (those two are end-of-turn
tokens, so generation usually stops on them and the text just ends). The analysis channel is reasoning, the final
channel (and a commentary without recipient, a preamble) is content, and a commentary addressed
`to=functions.NAME` is a call whose JSON arguments stream. A recipient that is not one of `functions` (GPT-OSS's
built-in browser or python) is not a call of the request: its raw text stays content.

The recipient may also come before the channel (`<|start|>assistant to=functions.NAME<|channel|>commentary json`),
as GPT-OSS's own chat template renders earlier calls.
"""

import re
from typing import Final

from exo.tool_calls.arguments.json_stream import JsonValueStreamer
from exo.tool_calls.arguments.schema import SchemaView
from exo.tool_calls.format import CallRegion, CallSink, HistoryNeeds, MarkedFormat
from exo.tool_calls.grammar.lark import LarkWriter, literal
from exo.tool_calls.grammar.reply import ReplyRequest
from exo.tool_calls.grammar.spec import ReplyShape
from exo.tool_calls.markers import MarkerScanner

START: Final = "<|start|>"
CHANNEL: Final = "<|channel|>"
MESSAGE: Final = "<|message|>"
END: Final = "<|end|>"
CALL: Final = "<|call|>"
RETURN: Final = "<|return|>"
CONSTRAIN: Final = "<|constrain|>"
_MESSAGE_ENDS = (END, CALL, RETURN)
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_FUNCTIONS = "functions."
_LONGEST_HEADER = 512

_HEADER = "header"
_TEXT = "text"  # a reasoning or content message
_ARGUMENTS = "arguments"
_AFTER_ARGUMENTS = "after_arguments"


class HarmonyMessageRegion:
    """One harmony message, from `<|channel|>` or `<|start|>` to its end tag (or the end of generation)."""

    def __init__(self, sink: CallSink, marker: str) -> None:
        self._sink = sink
        self._opened_by_channel = marker == CHANNEL
        self._state = _HEADER
        self._header = MarkerScanner((MESSAGE,))
        self._header_parts: list[str] = []
        self._header_length = 0
        self._body = MarkerScanner(_MESSAGE_ENDS)
        self._is_reasoning = False
        self._arguments: JsonValueStreamer | None = None
        self._finished = False

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def handoff_marker(self) -> str | None:
        return None

    def feed(self, text: str, position: int) -> int:
        while position < len(text) and not (self._finished or self._sink.paused):
            if self._state == _HEADER:
                position = self._feed_header(text, position)
            elif self._state == _ARGUMENTS:
                position = self._feed_arguments(text, position)
            else:
                position = self._feed_body(text, position)
        return position

    def _feed_header(self, text: str, position: int) -> int:
        result = self._header.scan(text, position)
        self._header_parts.append(result.released)
        self._header_length += len(result.released)
        if result.marker is None:
            if self._header_length > _LONGEST_HEADER:
                self._sink.reject("a harmony message header that never ends")
            return result.position
        self._open("".join(self._header_parts))
        return result.position

    def _open(self, header: str) -> None:
        channel_text = header if self._opened_by_channel else header.partition(CHANNEL)[2]
        channel = channel_text.split()[0] if channel_text.split() else ""
        recipient_match = _RECIPIENT.search(header)
        recipient = recipient_match.group(1) if recipient_match is not None else None
        if recipient is None:
            self._is_reasoning = channel == "analysis"
            self._state = _TEXT
            self._sink.settle()
            return
        name = recipient.removeprefix(_FUNCTIONS)
        tool = self._sink.find_tool(name) if recipient.startswith(_FUNCTIONS) else None
        if tool is None:
            self._sink.reject(f"a harmony message to {recipient!r}, which is not a function of the request")
            return
        self._sink.open_call(tool)
        self._arguments = JsonValueStreamer(SchemaView.of_tool(tool.parameters))
        self._state = _ARGUMENTS

    def _feed_arguments(self, text: str, position: int) -> int:
        streamer = self._arguments
        assert streamer is not None
        position = streamer.feed(text, position)
        self._sink.arguments(streamer.take())
        if streamer.error is not None:
            self._sink.arguments(streamer.take_held())
            self._sink.note_failure(f"tool call arguments stopped being JSON: {streamer.error}")
            self._state = _AFTER_ARGUMENTS
            self._is_reasoning = False
        elif streamer.done:
            self._sink.close_call()
            self._state = _AFTER_ARGUMENTS
        return position

    def _feed_body(self, text: str, position: int) -> int:
        result = self._body.scan(text, position)
        if self._state == _TEXT:
            self._emit(result.released)
        elif self._arguments is not None and not self._arguments.done:
            self._sink.arguments(result.released)  # broken arguments: the rest, verbatim
        elif result.released.strip():
            self._sink.note_failure("text after a harmony call's arguments was kept as content")
            self._sink.content(result.released)
        if result.marker is not None:
            self._end()
        return result.position

    def _emit(self, text: str) -> None:
        if text:
            (self._sink.reasoning if self._is_reasoning else self._sink.content)(text)

    def _end(self) -> None:
        if self._arguments is not None and not self._arguments.done:
            self._sink.close_call()
        self._finished = True

    def finish(self) -> None:
        """Generation ended inside the message (usually on `<|call|>` or `<|return|>`, which end the turn)."""
        if self._state == _HEADER:
            self._sink.reject("generation ended inside a harmony message header")
        elif self._state == _ARGUMENTS and self._arguments is not None:
            self._arguments.finish_scalar_at_end()
            self._sink.arguments(self._arguments.take_held())
            if not self._arguments.done:
                self._sink.note_failure("generation ended inside the tool call's arguments")
            self._sink.close_call()
        elif self._state == _TEXT:
            self._emit(self._body.flush())
        elif self._arguments is not None and not self._arguments.done:
            self._sink.arguments(self._body.flush())
            self._sink.close_call()
        self._finished = True


class HarmonyGrammar:
    """An optional analysis message, then the final answer or one call (`<|call|>` ends the turn, so GPT-OSS makes
    one call per turn)."""

    marker_texts: tuple[str, ...] = (START, CHANNEL, MESSAGE, END, CONSTRAIN)

    def reply(self, lark: LarkWriter, request: ReplyRequest, /) -> str:
        channel, message = lark.marker(CHANNEL), lark.marker(MESSAGE)
        analysis = lark.rule(
            "analysis",
            f"{channel} {literal('analysis')} {message} {lark.text_until(END, 'analysis')} "
            f"{lark.marker(START)} {literal('assistant')}",
        )
        final_head = f"{channel} {literal('final')} {message}"
        match request.shape:
            case ReplyShape.TEXT_ONLY:
                body = f"{final_head} {lark.prose()}"
            case ReplyShape.CALLS:
                body = self._call(lark, request)
            case ReplyShape.TEXT_OR_CALLS:
                body = f"{final_head} {lark.prose()} | {self._call(lark, request)}"
            case ReplyShape.ANSWER_OR_CALLS:
                body = f"{final_head} answer | {self._call(lark, request)}"
        return f"{analysis}? ({body})"

    def _call(self, lark: LarkWriter, request: ReplyRequest) -> str:
        alternatives = [
            lark.rule(
                f"call_{tool.name}",
                f"{lark.marker(CHANNEL)} {literal(f'commentary to={_FUNCTIONS}{tool.name} ')} "
                f"{lark.marker(CONSTRAIN)} {literal('json')} {lark.marker(MESSAGE)} "
                f"{lark.arguments(tool.parameters, every_keyword_enforced=bool(tool.strict))}",
            )
            for tool in request.tools
        ]
        return lark.rule("call", " | ".join(alternatives))


class HarmonyFormat(MarkedFormat):
    start_markers: tuple[str, ...] = (CHANNEL, START)
    frames_every_reply = True
    history = HistoryNeeds(reasoning_field="thinking")
    grammar = HarmonyGrammar()

    def open_region(self, marker: str, sink: CallSink, /) -> CallRegion:
        return HarmonyMessageRegion(sink, marker)
