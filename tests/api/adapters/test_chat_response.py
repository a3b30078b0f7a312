"""collect_response: the non-streaming answer assembled from the same chunks the stream carries."""

from collections.abc import AsyncIterator, Sequence

import pytest

from exo.api.adapters.chat_response import collect_response
from exo.api.errors import ApiError
from exo.api.types.openai_chat import ChatCompletionResponse
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
USAGE = Usage(prompt_tokens=20, completion_tokens=7, cached_tokens=4, reasoning_tokens=2)


async def _chunks(chunks: Sequence[Chunk]) -> AsyncIterator[Chunk]:
    for chunk in chunks:
        yield chunk


async def collect(chunks: Sequence[Chunk]) -> ChatCompletionResponse:
    return await collect_response(_chunks(chunks), completion_id="chatcmpl-test", created=1, model="test-model")


async def test_tool_calls_give_null_content_finish_tool_calls_and_joined_arguments() -> None:
    response = await collect(
        [
            ToolCallChunk(index=0, call_id=CALL_0, name="get_weather"),
            ToolCallArgumentsChunk(index=0, fragment='{"city": '),
            ToolCallArgumentsChunk(index=0, fragment='"Paris"}'),
            ToolCallChunk(index=1, call_id=CALL_1, name="write"),
            ToolCallArgumentsChunk(index=1, fragment='{"path": "a.txt"}'),
            FinishChunk(finish_reason="tool_calls", usage=USAGE),
        ]
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert [
        (call.id, call.type, call.function.name, call.function.arguments) for call in choice.message.tool_calls or []
    ] == [
        (CALL_0, "function", "get_weather", '{"city": "Paris"}'),
        (CALL_1, "function", "write", '{"path": "a.txt"}'),
    ]
    assert (response.usage.total_tokens, response.usage.prompt_tokens_details.cached_tokens) == (27, 4)


async def test_content_before_a_call_is_kept_next_to_it() -> None:
    response = await collect(
        [
            TokenChunk(text="Checking."),
            ToolCallChunk(index=0, call_id=CALL_0, name="get_weather"),
            ToolCallArgumentsChunk(index=0, fragment='{"city": "Paris"}'),
            FinishChunk(finish_reason="tool_calls", usage=USAGE),
        ]
    )
    message = response.choices[0].message
    assert message.content == "Checking."
    assert len(message.tool_calls or []) == 1


async def test_plain_answer_has_text_content_reasoning_and_no_tool_calls() -> None:
    response = await collect(
        [ReasoningChunk(text="hmm"), TokenChunk(text="Hi"), FinishChunk(finish_reason="stop", usage=USAGE)]
    )
    message = response.choices[0].message
    assert (message.content, message.reasoning_content, message.tool_calls) == ("Hi", "hmm", None)
    assert response.choices[0].finish_reason == "stop"


async def test_an_error_chunk_becomes_an_api_error_with_its_status() -> None:
    with pytest.raises(ApiError) as raised:
        await collect([TokenChunk(text="x"), ErrorChunk(error="context_length_exceeded", message="too long")])
    assert raised.value.status_code == 400
    assert raised.value.body.error.code == "context_length_exceeded"


async def test_chunks_ending_without_finish_are_a_server_error() -> None:
    with pytest.raises(ApiError) as raised:
        await collect([TokenChunk(text="cut")])
    assert raised.value.status_code == 500


async def test_loop_guard_warnings_appear_only_when_there_are_some() -> None:
    quiet = await collect([TokenChunk(text="Done."), FinishChunk(finish_reason="stop", usage=USAGE)])
    assert quiet.exo_loop_warnings is None
    assert "exo_loop_warnings" not in quiet.model_dump(exclude_none=True)
    warned = await collect(
        [TokenChunk(text="Done."), FinishChunk(finish_reason="stop", usage=USAGE, loop_warnings=("ping-pong",))]
    )
    assert warned.exo_loop_warnings == ["ping-pong"]
