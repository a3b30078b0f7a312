"""Chunks → Anthropic Messages stream events, and the message they add up to.

One content block is open at a time, in the order the model wrote them: thinking, text, then one tool_use block
per call (text after a call opens a new text block). Tool input streams as `input_json_delta` fragments exactly as
the runner parsed them, so the fragments concatenate to the call's JSON arguments. The encoder keeps the message
the events describe, so the non-streaming answer is the same fold of the same events.

A stream kept waiting (a long prefill) is kept alive with content events, because Claude Code's stream watchdog
counts every Messages event except `ping` and gives up after 5 minutes without one: the first keep-alive opens an
empty text block at index 0, later ones send empty deltas of the open block. The model's text continues that block;
a call or thinking closes it and takes the next index, so the message then starts with an empty text block, as the
`anthropic` SDKs accumulate it from the events.
"""

import json
from typing import Literal

from exo.api.adapters.messages_errors import anthropic_error
from exo.api.errors import task_error
from exo.api.types.anthropic_messages import (
    AnthropicMessage,
    ContentBlock,
    MessageUsage,
    StopReason,
    TextContent,
    ThinkingContent,
    ToolUseContent,
)
from exo.api.types.anthropic_stream_events import (
    ContentBlockDeltaEvent,
    ContentBlockStartEvent,
    ContentBlockStopEvent,
    ErrorEvent,
    InputJsonDelta,
    MessageDeltaBody,
    MessageDeltaEvent,
    MessageDeltaUsage,
    MessageStartEvent,
    MessageStopEvent,
    MessageStreamEvent,
    TextDelta,
    ThinkingDelta,
)
from exo.shared.types.chunks import (
    Chunk,
    ErrorChunk,
    FinishChunk,
    PrefillProgressChunk,
    ReasoningChunk,
    TokenChunk,
    ToolCallArgumentsChunk,
    ToolCallChunk,
    Usage,
)

BlockKind = Literal["text", "thinking", "tool_use"]


class _Block:
    """A content block being written: its text (or tool input JSON) so far."""

    __slots__ = ("call_id", "kind", "name", "parts", "position")

    def __init__(self, kind: BlockKind, call_id: str = "", name: str = "") -> None:
        self.kind: BlockKind = kind
        self.position = 0
        self.call_id = call_id
        self.name = name
        self.parts: list[str] = []

    def content(self) -> ContentBlock:
        text = "".join(self.parts)
        match self.kind:
            case "text":
                return TextContent(text=text)
            case "thinking":
                return ThinkingContent(thinking=text)
            case "tool_use":
                return ToolUseContent(id=self.call_id, name=self.name, input=_tool_input(text))


def _tool_input(arguments: str) -> dict[str, object]:
    """The call's input object. A model that broke its JSON (the runner logs it) leaves `{}`: input must be one."""
    try:
        decoded: object = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        return {}
    return {str(key): value for key, value in decoded.items()} if isinstance(decoded, dict) else {}  # pyright: ignore[reportUnknownVariableType]


def _empty_delta(kind: BlockKind) -> TextDelta | ThinkingDelta | InputJsonDelta:
    match kind:
        case "text":
            return TextDelta(text="")
        case "thinking":
            return ThinkingDelta(thinking="")
        case "tool_use":
            return InputJsonDelta(partial_json="")


def message_usage(usage: Usage) -> MessageDeltaUsage:
    """Anthropic's three-part prompt count: `input_tokens` excludes the tokens read from exo's prefix cache."""
    return MessageDeltaUsage(
        input_tokens=usage.prompt_tokens - usage.cached_tokens,
        output_tokens=usage.completion_tokens,
        cache_creation_input_tokens=0,
        cache_read_input_tokens=usage.cached_tokens,
        withdrawn_tool_calls=usage.withdrawn_tool_calls,
    )


def stop_reason(finish: FinishChunk, called_tools: bool) -> StopReason:
    if finish.finish_reason == "length":
        return "max_tokens"
    # Anthropic says tool_use whenever the answer holds tool_use blocks, a forced tool choice included.
    if called_tools:
        return "tool_use"
    return "stop_sequence" if finish.stop_sequence is not None else "end_turn"


class MessageStreamEncoder:
    """Encodes one answer's chunks as stream events and keeps the message they describe."""

    def __init__(self, message_id: str, model: str) -> None:
        self._message_id = message_id
        self._model = model
        self._blocks: list[_Block] = []
        self._open: _Block | None = None
        self._call_blocks: dict[int, _Block] = {}
        self._stop_reason: StopReason | None = None
        self._stop_sequence: str | None = None
        self._usage = MessageUsage(input_tokens=0, output_tokens=0)
        self._loop_warnings: list[str] | None = None

    def message(self) -> AnthropicMessage:
        """The message as the events so far describe it (complete after the FinishChunk)."""
        return AnthropicMessage(
            id=self._message_id,
            model=self._model,
            content=[block.content() for block in self._blocks],
            stop_reason=self._stop_reason,
            stop_sequence=self._stop_sequence,
            usage=self._usage,
            exo_loop_warnings=self._loop_warnings,
        )

    def whole(self) -> AnthropicMessage:
        return self.message()

    def start(self) -> list[MessageStreamEvent]:
        """message_start: the empty message (its usage arrives in message_delta, once the prompt is counted)."""
        return [MessageStartEvent(message=self.message())]

    def keep_alive(self) -> list[MessageStreamEvent]:
        """Events that add nothing to the message, for a stream that has been silent a while: before any output the
        start of an empty text block (the model's text continues it), then an empty delta of the open block."""
        if self._open is not None:
            return [ContentBlockDeltaEvent(index=self._open.position, delta=_empty_delta(self._open.kind))]
        if self._blocks:
            return []  # the message is finished: nothing is waiting
        return self._open_block(_Block("text"))

    def encode(self, chunk: Chunk) -> list[MessageStreamEvent]:
        match chunk:
            case TokenChunk(text=text) if text:
                return self._append("text", text, TextDelta(text=text))
            case ReasoningChunk(text=text) if text:
                return self._append("thinking", text, ThinkingDelta(thinking=text))
            case ToolCallChunk(index=index, call_id=call_id, name=name):
                block = _Block("tool_use", call_id, name)
                self._call_blocks[index] = block
                return [*self._close(), *self._open_block(block)]
            case ToolCallArgumentsChunk(index=index, fragment=fragment) if fragment:
                block = self._call_blocks[index]
                if block is not self._open:
                    raise ValueError(f"arguments for tool call {index} arrived after its block was closed")
                block.parts.append(fragment)
                delta = InputJsonDelta(partial_json=fragment)
                return [ContentBlockDeltaEvent(index=block.position, delta=delta)]
            case FinishChunk():
                return [*self._close(), *self._finish(chunk)]
            case ErrorChunk():
                return [ErrorEvent(error=anthropic_error(task_error(chunk)).error)]
            case PrefillProgressChunk():
                return []  # not content: the keep-alive comments carry it (completion_flow.py)
            case _:
                return []  # an empty text or argument fragment

    def _append(self, kind: BlockKind, text: str, delta: TextDelta | ThinkingDelta) -> list[MessageStreamEvent]:
        events: list[MessageStreamEvent] = []
        if self._open is None or self._open.kind != kind:
            events = [*self._close(), *self._open_block(_Block(kind))]
        assert self._open is not None
        self._open.parts.append(text)
        events.append(ContentBlockDeltaEvent(index=self._open.position, delta=delta))
        return events

    def _open_block(self, block: _Block) -> list[MessageStreamEvent]:
        block.position = len(self._blocks)
        self._blocks.append(block)
        self._open = block
        # The start event carries the empty block; its text or input arrives in the deltas.
        empty = _Block(block.kind, block.call_id, block.name).content()
        return [ContentBlockStartEvent(index=block.position, content_block=empty)]

    def _close(self) -> list[MessageStreamEvent]:
        if self._open is None:
            return []
        closed, self._open = self._open, None
        return [ContentBlockStopEvent(index=closed.position)]

    def _finish(self, finish: FinishChunk) -> list[MessageStreamEvent]:
        self._stop_reason = stop_reason(finish, bool(self._call_blocks))
        self._stop_sequence = finish.stop_sequence if self._stop_reason == "stop_sequence" else None
        usage = message_usage(finish.usage)
        self._usage = MessageUsage.model_validate(usage.model_dump())
        self._loop_warnings = list(finish.loop_warnings) or None
        delta = MessageDeltaBody(stop_reason=self._stop_reason, stop_sequence=self._stop_sequence)
        message_delta = MessageDeltaEvent(delta=delta, usage=usage, exo_loop_warnings=self._loop_warnings)
        return [message_delta, MessageStopEvent()]
