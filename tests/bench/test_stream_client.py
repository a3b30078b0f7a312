"""The streaming client reads usage, cached tokens and tool calls from an OpenAI SSE stream."""

import json

import httpx
import pytest

from bench.stream_client import stream_chat


def _sse(*payloads: dict[str, object]) -> bytes:
    events = [f"data: {json.dumps(payload)}\n\n" for payload in payloads]
    return ("".join(events) + "data: [DONE]\n\n").encode()


def _client(body: bytes, status: int = 200) -> httpx.AsyncClient:
    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/chat/completions"
        return httpx.Response(status, content=body, headers={"content-type": "text/event-stream"})

    return httpx.AsyncClient(transport=httpx.MockTransport(answer))


def _choice(delta: dict[str, object]) -> dict[str, object]:
    return {"choices": [{"index": 0, "delta": delta}]}


async def test_usage_in_the_last_chunk_gives_tokens_and_cached_prompt_tokens() -> None:
    body = _sse(
        _choice({"role": "assistant", "content": ""}),
        _choice({"content": "Hello"}),
        _choice({"content": " world"}),
        {
            "choices": [],
            "usage": {"prompt_tokens": 40, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 32}},
        },
    )
    async with _client(body) as client:
        outcome = await stream_chat(client, "http://server", {})
    measurement = outcome.measurement
    assert (measurement.completion_tokens, measurement.prompt_tokens, measurement.cached_tokens) == (3, 40, 32)
    assert measurement.text == "Hello world"
    assert 0 <= measurement.ttft_s <= measurement.total_s
    assert outcome.tool_call is None


async def test_without_usage_generated_chunks_are_counted_and_the_tool_call_is_assembled() -> None:
    call = {"index": 0, "id": "call_1", "function": {"name": "read", "arguments": ""}}
    body = _sse(
        _choice({"role": "assistant", "content": ""}),
        _choice({"tool_calls": [call]}),
        _choice({"tool_calls": [{"index": 0, "function": {"arguments": '{"file_path"'}}]}),
        _choice({"tool_calls": [{"index": 0, "function": {"arguments": ': "a.py"}'}}]}),
    )
    async with _client(body) as client:
        outcome = await stream_chat(client, "http://server", {})
    assert outcome.measurement.completion_tokens == 3
    assert outcome.tool_call == ("read", '{"file_path": "a.py"}')


async def test_an_http_error_is_raised_with_the_server_message() -> None:
    async with _client(b'{"error": "no model"}', status=400) as client:
        with pytest.raises(RuntimeError, match="no model"):
            await stream_chat(client, "http://server", {})
