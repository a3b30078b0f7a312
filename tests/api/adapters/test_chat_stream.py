"""ChunkEncoder + sse_events: every shape of response streams within the contract (checked by the checker)."""

import json
from collections.abc import AsyncIterator, Sequence

from exo.api.adapters.chat_stream import ChunkEncoder, sse_events
from exo.conformance.checker import check_stream, sse_payloads
from exo.conformance.contract import DONE_PAYLOAD, StreamCheck
from exo.shared.types.chunks import (
    Chunk,
    ErrorChunk,
    FinishChunk,
    ReasoningChunk,
    TokenChunk,
    ToolCallArgumentsChunk,
    ToolCallChunk,
    Usage,
)
from exo.shared.types.common import ToolCallId

CALL_0 = ToolCallId("call_" + "A1" * 12)
CALL_1 = ToolCallId("call_" + "b2" * 12)
USAGE = Usage(prompt_tokens=20, completion_tokens=7, cached_tokens=16, reasoning_tokens=3)


async def _chunks(chunks: Sequence[Chunk]) -> AsyncIterator[Chunk]:
    for chunk in chunks:
        yield chunk


async def stream(chunks: Sequence[Chunk], *, include_usage: bool) -> list[str]:
    """The `data:` payloads of the SSE body the API sends for `chunks`."""
    encoder = ChunkEncoder("chatcmpl-test", 1700000000, "test-model", include_usage)
    body = "".join([event async for event in sse_events(encoder, chunks[0], _chunks(chunks[1:]))])
    return sse_payloads(body)


def decoded(payload: str) -> dict[str, object]:
    value: dict[str, object] = json.loads(payload)
    return value


def assert_keeps_contract(payloads: Sequence[str], *, include_usage: bool) -> StreamCheck:
    checked = check_stream(payloads, include_usage=include_usage)
    assert checked.violations == ()
    return checked


async def test_content_streams_after_one_role_chunk_and_ends_with_stop() -> None:
    payloads = await stream(
        [TokenChunk(text="Hel"), TokenChunk(text="lo"), FinishChunk(finish_reason="stop", usage=USAGE)],
        include_usage=False,
    )
    summary = assert_keeps_contract(payloads, include_usage=False).summary
    assert (summary.role, summary.content, summary.finish_reason) == ("assistant", "Hello", "stop")
    assert payloads[-1] == DONE_PAYLOAD
    assert all("usage" not in decoded(payload) for payload in payloads[:-1])


async def test_reasoning_streams_as_reasoning_content_before_the_answer() -> None:
    chunks: list[Chunk] = [
        ReasoningChunk(text="Think"),
        ReasoningChunk(text=" first."),
        TokenChunk(text="Answer"),
        FinishChunk(finish_reason="stop", usage=USAGE),
    ]
    summary = assert_keeps_contract(await stream(chunks, include_usage=True), include_usage=True).summary
    assert (summary.reasoning, summary.content) == ("Think first.", "Answer")


async def test_a_tool_call_streams_its_header_then_argument_fragments() -> None:
    chunks: list[Chunk] = [
        ToolCallChunk(index=0, call_id=CALL_0, name="get_weather"),
        ToolCallArgumentsChunk(index=0, fragment='{"city": '),
        ToolCallArgumentsChunk(index=0, fragment='"Paris"}'),
        FinishChunk(finish_reason="tool_calls", usage=USAGE),
    ]
    payloads = await stream(chunks, include_usage=True)
    summary = assert_keeps_contract(payloads, include_usage=True).summary
    assert [(call.call_id, call.name, call.arguments) for call in summary.calls] == [
        (CALL_0, "get_weather", '{"city": "Paris"}')
    ]
    header = decoded(payloads[1])["choices"]
    assert header == [
        {
            "index": 0,
            "delta": {
                "tool_calls": [
                    {"index": 0, "id": CALL_0, "type": "function", "function": {"name": "get_weather", "arguments": ""}}
                ]
            },
            "logprobs": None,
            "finish_reason": None,
        }
    ]


async def test_parallel_calls_get_their_own_indices() -> None:
    chunks: list[Chunk] = [
        TokenChunk(text="Both."),
        ToolCallChunk(index=0, call_id=CALL_0, name="get_weather"),
        ToolCallArgumentsChunk(index=0, fragment='{"city": "Paris"}'),
        ToolCallChunk(index=1, call_id=CALL_1, name="get_weather"),
        ToolCallArgumentsChunk(index=1, fragment='{"city": '),
        ToolCallArgumentsChunk(index=1, fragment='"Rome"}'),
        FinishChunk(finish_reason="tool_calls", usage=USAGE),
    ]
    summary = assert_keeps_contract(await stream(chunks, include_usage=True), include_usage=True).summary
    assert [(call.index, call.call_id, call.arguments) for call in summary.calls] == [
        (0, CALL_0, '{"city": "Paris"}'),
        (1, CALL_1, '{"city": "Rome"}'),
    ]
    assert summary.content == "Both."


async def test_include_usage_adds_one_usage_chunk_with_no_choices_before_done() -> None:
    payloads = await stream([TokenChunk(text="Hi"), FinishChunk(finish_reason="stop", usage=USAGE)], include_usage=True)
    assert_keeps_contract(payloads, include_usage=True)
    usage_chunk = decoded(payloads[-2])
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {
        "prompt_tokens": 20,
        "completion_tokens": 7,
        "total_tokens": 27,
        "prompt_tokens_details": {"cached_tokens": 16},
        "completion_tokens_details": {"reasoning_tokens": 3},
    }
    assert sum("usage" in decoded(payload) for payload in payloads[:-1]) == 1


async def test_empty_text_and_empty_fragments_send_no_delta() -> None:
    chunks: list[Chunk] = [
        TokenChunk(text=""),
        ToolCallChunk(index=0, call_id=CALL_0, name="get_weather"),
        ToolCallArgumentsChunk(index=0, fragment=""),
        ToolCallArgumentsChunk(index=0, fragment="{}"),
        FinishChunk(finish_reason="tool_calls", usage=USAGE),
    ]
    payloads = await stream(chunks, include_usage=False)
    assert_keeps_contract(payloads, include_usage=False)
    # role, call header, one fragment, finish, [DONE]
    assert len(payloads) == 5


async def test_an_error_mid_stream_is_one_error_event_then_done() -> None:
    chunks: list[Chunk] = [
        TokenChunk(text="partial"),
        ErrorChunk(error="generation_failed", message="generation failed: boom"),
        TokenChunk(text="never sent"),
    ]
    payloads = await stream(chunks, include_usage=True)
    checked = assert_keeps_contract(payloads, include_usage=True)
    assert checked.summary.errored
    assert checked.summary.content == "partial"
    assert payloads[-1] == DONE_PAYLOAD
    assert sum("error" in decoded(payload) for payload in payloads[:-1]) == 1
    assert decoded(payloads[-2]) == {
        "error": {"message": "generation failed: boom", "type": "server_error", "param": None, "code": None}
    }


async def test_an_error_before_any_output_still_opens_and_closes_the_stream() -> None:
    first = ErrorChunk(error="context_length_exceeded", message="too long")
    payloads = await stream([first], include_usage=True)
    assert_keeps_contract(payloads, include_usage=True)
    assert len(payloads) == 3
    assert "error" in decoded(payloads[1])


async def test_a_stream_that_ends_without_finish_closes_with_an_error_event() -> None:
    payloads = await stream([TokenChunk(text="cut"), TokenChunk(text=" off")], include_usage=True)
    checked = assert_keeps_contract(payloads, include_usage=True)
    assert checked.summary.errored
    assert [("error" in decoded(payload)) for payload in payloads[:-1]] == [False, False, False, True]


async def test_loop_guard_warnings_ride_on_the_finishing_chunk_within_the_contract() -> None:
    warning = "repeated call write(...): its result is already in the conversation"
    payloads = await stream(
        [
            ToolCallChunk(index=0, call_id=ToolCallId("call_" + "A1" * 12), name="write"),
            ToolCallArgumentsChunk(index=0, fragment='{"path": "a"}'),
            FinishChunk(finish_reason="tool_calls", usage=USAGE, loop_warnings=(warning,)),
        ],
        include_usage=True,
    )
    assert_keeps_contract(payloads, include_usage=True)
    carrying = [decoded(payload) for payload in payloads[:-1] if "exo_loop_warnings" in decoded(payload)]
    assert len(carrying) == 1
    assert carrying[0]["exo_loop_warnings"] == [warning]
