"""Keep-alives of a Messages stream are content events that add nothing to the message (Claude Code's stream
watchdog counts every event but `ping`), and the message the encoder keeps is what the `anthropic` SDK accumulates
from the very events on the wire, whichever output comes first after the keep-alives.
"""

import json
from typing import Any

import anthropic
import httpx2
import pytest
from anthropic.lib.streaming._messages import accumulate_event  # pyright: ignore[reportPrivateUsage]

from exo.api.adapters.messages_stream import MessageStreamEncoder
from exo.api.adapters.protocol_events import NamedEventWriter
from exo.conformance.messages_contract import check_messages_stream
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
from exo.shared.types.common import ToolCallId

USAGE = Usage(prompt_tokens=100, completion_tokens=3, cached_tokens=40)
CALL = ToolCallId("call_aaaaaaaaaaaaaaaaaaaaaaa1")
# A keep-alive where the stream stands in the list of what happens to it.
KEEP_ALIVE = "keep-alive"
PREFILL = PrefillProgressChunk(prompt_tokens=100, done_tokens=50, cached_tokens=40)


class Stream:
    """One answer written as AnswerStream writes it: the opening, then keep-alives and chunks in a given order."""

    def __init__(self) -> None:
        self.encoder = MessageStreamEncoder("msg_1", "m")
        self.writer = NamedEventWriter(self.encoder, keep_alive_events=self.encoder.keep_alive)
        self.texts = self.writer.opening()

    def play(self, steps: list[Chunk | str]) -> "Stream":
        for step in steps:
            if step == KEEP_ALIVE:
                self.texts += self.writer.keep_alive("prefill 50/100 tokens (40 cached)")
            else:
                assert not isinstance(step, str)
                self.texts += self.writer.encode(step)
        return self

    @property
    def body(self) -> str:
        return "".join(self.texts)

    def events(self) -> list[dict[str, Any]]:
        """The data of every event, comment lines skipped (as every SSE parser does)."""
        events: list[dict[str, Any]] = []
        for text in self.texts:
            if text.startswith(":"):
                continue
            name, data = text.strip().split("\n")
            event = json.loads(data.removeprefix("data: "))
            assert name == f"event: {event['type']}"
            events.append(event)
        return events

    def sdk_message(self) -> anthropic.types.Message:
        """What the `anthropic` SDK's stream accumulator makes of the events."""
        snapshot: Any = None
        buffers: dict[int, bytes] = {}
        for event in self.events():
            snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=buffers)  # pyright: ignore[reportArgumentType]
        return anthropic.types.Message.model_validate(snapshot.model_dump())


def summary(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Each event as (type, index, what it carries)."""
    rows: list[tuple[Any, ...]] = []
    for event in events:
        match event["type"]:
            case "content_block_start":
                rows.append(("start", event["index"], event["content_block"]["type"]))
            case "content_block_delta":
                delta = event["delta"]
                value = delta.get("text", delta.get("thinking", delta.get("partial_json")))
                rows.append(("delta", event["index"], delta["type"], value))
            case "content_block_stop":
                rows.append(("stop", event["index"]))
            case kind:
                rows.append((kind,))
    return rows


def assert_sdk_agrees(stream: Stream) -> None:
    """The SDK's accumulated message is exactly the encoder's message (the non-streaming fold), and the stream
    follows the Messages grammar."""
    whole = anthropic.types.Message.model_validate(json.loads(stream.encoder.whole().model_dump_json()))
    assert stream.sdk_message().model_dump(exclude_none=True) == whole.model_dump(exclude_none=True)
    checked = check_messages_stream(stream.body)
    assert checked.violations == (), checked.violations


def test_the_first_keep_alive_opens_an_empty_text_block_and_later_ones_send_empty_deltas() -> None:
    stream = Stream().play([PREFILL, KEEP_ALIVE, PREFILL, KEEP_ALIVE, KEEP_ALIVE])
    assert summary(stream.events()) == [
        ("message_start",),
        ("start", 0, "text"),
        ("delta", 0, "text_delta", ""),
        ("delta", 0, "text_delta", ""),
    ]
    # The comment line saying where the request stands still goes first, for people reading the raw stream.
    comments = [text for text in stream.texts if text.startswith(":")]
    assert comments == [": prefill 50/100 tokens (40 cached)\n\n"] * 3


def test_text_after_keep_alives_continues_the_open_text_block() -> None:
    stream = Stream().play(
        [
            KEEP_ALIVE,
            KEEP_ALIVE,
            TokenChunk(text="Hel"),
            KEEP_ALIVE,  # a silence while decoding: an empty delta of the open block, no new block
            TokenChunk(text="lo"),
            FinishChunk(finish_reason="stop", usage=USAGE),
        ]
    )
    assert summary(stream.events()) == [
        ("message_start",),
        ("start", 0, "text"),
        ("delta", 0, "text_delta", ""),
        ("delta", 0, "text_delta", "Hel"),
        ("delta", 0, "text_delta", ""),
        ("delta", 0, "text_delta", "lo"),
        ("stop", 0),
        ("message_delta",),
        ("message_stop",),
    ]
    message = stream.encoder.whole()
    assert [block.model_dump() for block in message.content] == [{"type": "text", "text": "Hello", "citations": None}]
    assert message.stop_reason == "end_turn"
    assert_sdk_agrees(stream)


def test_a_tool_call_after_keep_alives_closes_the_empty_text_block_and_takes_index_1() -> None:
    stream = Stream().play(
        [
            KEEP_ALIVE,
            KEEP_ALIVE,
            ToolCallChunk(index=0, call_id=CALL, name="Write"),
            ToolCallArgumentsChunk(index=0, fragment='{"file_path": "hello.txt", '),
            KEEP_ALIVE,  # while the call's arguments are written: an empty input_json_delta
            ToolCallArgumentsChunk(index=0, fragment='"content": "hello"}'),
            FinishChunk(finish_reason="tool_calls", usage=USAGE),
        ]
    )
    assert summary(stream.events()) == [
        ("message_start",),
        ("start", 0, "text"),
        ("delta", 0, "text_delta", ""),
        ("stop", 0),
        ("start", 1, "tool_use"),
        ("delta", 1, "input_json_delta", '{"file_path": "hello.txt", '),
        ("delta", 1, "input_json_delta", ""),
        ("delta", 1, "input_json_delta", '"content": "hello"}'),
        ("stop", 1),
        ("message_delta",),
        ("message_stop",),
    ]
    message = stream.encoder.whole()
    assert [block.model_dump(exclude_none=True) for block in message.content] == [
        {"type": "text", "text": ""},
        {"type": "tool_use", "id": CALL, "name": "Write", "input": {"file_path": "hello.txt", "content": "hello"}},
    ]
    assert message.stop_reason == "tool_use"
    assert_sdk_agrees(stream)


def test_thinking_after_keep_alives_closes_the_empty_text_block_and_text_after_it_opens_a_new_one() -> None:
    stream = Stream().play(
        [
            KEEP_ALIVE,
            ReasoningChunk(text="The user "),
            KEEP_ALIVE,
            ReasoningChunk(text="greets."),
            TokenChunk(text="Hi"),
            FinishChunk(finish_reason="stop", usage=USAGE),
        ]
    )
    assert summary(stream.events()) == [
        ("message_start",),
        ("start", 0, "text"),
        ("stop", 0),
        ("start", 1, "thinking"),
        ("delta", 1, "thinking_delta", "The user "),
        ("delta", 1, "thinking_delta", ""),
        ("delta", 1, "thinking_delta", "greets."),
        ("stop", 1),
        ("start", 2, "text"),
        ("delta", 2, "text_delta", "Hi"),
        ("stop", 2),
        ("message_delta",),
        ("message_stop",),
    ]
    message = stream.encoder.whole()
    assert [block.model_dump(exclude_none=True) for block in message.content] == [
        {"type": "text", "text": ""},
        {"type": "thinking", "thinking": "The user greets.", "signature": ""},
        {"type": "text", "text": "Hi"},
    ]
    assert_sdk_agrees(stream)


def test_an_answer_with_no_output_after_a_keep_alive_keeps_the_empty_text_block() -> None:
    stream = Stream().play([KEEP_ALIVE, FinishChunk(finish_reason="length", usage=USAGE)])
    assert summary(stream.events())[1:] == [("start", 0, "text"), ("stop", 0), ("message_delta",), ("message_stop",)]
    assert [block.model_dump(exclude_none=True) for block in stream.encoder.whole().content] == [
        {"type": "text", "text": ""}
    ]
    assert_sdk_agrees(stream)


def test_without_a_keep_alive_the_message_has_no_empty_block() -> None:
    stream = Stream().play(
        [
            ToolCallChunk(index=0, call_id=CALL, name="Write"),
            ToolCallArgumentsChunk(index=0, fragment='{"file_path": "a", "content": "b"}'),
            FinishChunk(finish_reason="tool_calls", usage=USAGE),
        ]
    )
    assert summary(stream.events())[1] == ("start", 0, "tool_use")
    assert [block.type for block in stream.encoder.whole().content] == ["tool_use"]
    assert_sdk_agrees(stream)


def test_an_error_after_keep_alives_ends_the_stream_with_an_error_event_the_sdk_raises() -> None:
    stream = Stream().play(
        [KEEP_ALIVE, KEEP_ALIVE, ErrorChunk(error="context_length_exceeded", message="the prompt is 9000 tokens")]
    )
    events = stream.events()
    assert summary(events) == [("message_start",), ("start", 0, "text"), ("delta", 0, "text_delta", ""), ("error",)]
    assert events[-1]["error"] == {
        "type": "invalid_request_error",
        "message": "prompt is too long: the prompt is 9000 tokens",
    }
    assert check_messages_stream(stream.body).violations == ()
    # The SDK's stream reader raises the error event as an API error (as Claude Code's does).
    replay = httpx2.MockTransport(
        lambda _: httpx2.Response(200, headers={"content-type": "text/event-stream"}, text=stream.body)
    )
    client = anthropic.Anthropic(
        api_key="unused", base_url="http://exo.invalid", max_retries=0, http_client=httpx2.Client(transport=replay)
    )
    with (
        pytest.raises(anthropic.APIStatusError, match="prompt is too long"),
        client.messages.stream(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]) as sdk_stream,
    ):
        sdk_stream.get_final_message()
