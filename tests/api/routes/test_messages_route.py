"""/v1/messages through the official `anthropic` SDK against the production app (scripted runner chunks).

Every chunk sequence a runner can send is streamed and collected; the SDK's own accumulator must end with
exactly the non-streaming message, and the raw events must follow the Messages API's event grammar.
"""

import json
from collections.abc import Iterator
from typing import Any

import pytest
from anthropic import Anthropic, APIStatusError, AuthenticationError, BadRequestError, NotFoundError
from fastapi.testclient import TestClient

from exo.node import NodeConfig
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
from tests.api.inprocess_app import SCRIPTED_MODEL, ScriptedMaster, scripted_app

USAGE = Usage(prompt_tokens=12, completion_tokens=5, cached_tokens=4)
PARIS = ToolCallId("call_aaaaaaaaaaaaaaaaaaaaaaa1")
ROME = ToolCallId("call_aaaaaaaaaaaaaaaaaaaaaaa2")
TOOLS: list[Any] = [
    {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
]


def call(index: int, call_id: ToolCallId, *fragments: str) -> list[Chunk]:
    return [
        ToolCallChunk(index=index, call_id=call_id, name="get_weather"),
        *(ToolCallArgumentsChunk(index=index, fragment=fragment) for fragment in fragments),
    ]


SCRIPTS: dict[str, tuple[list[Chunk], list[dict[str, Any]], str]] = {
    "text": (
        [TokenChunk(text="Hel"), TokenChunk(text="lo!"), FinishChunk(finish_reason="stop", usage=USAGE)],
        [{"type": "text", "text": "Hello!"}],
        "end_turn",
    ),
    "thinking_then_text": (
        [
            ReasoningChunk(text="The user "),
            ReasoningChunk(text="greets."),
            TokenChunk(text="Hi"),
            FinishChunk(finish_reason="stop", usage=USAGE),
        ],
        [{"type": "thinking", "thinking": "The user greets.", "signature": ""}, {"type": "text", "text": "Hi"}],
        "end_turn",
    ),
    "one_call": (
        [*call(0, PARIS, '{"city": ', '"Paris"}'), FinishChunk(finish_reason="tool_calls", usage=USAGE)],
        [{"type": "tool_use", "id": PARIS, "name": "get_weather", "input": {"city": "Paris"}}],
        "tool_use",
    ),
    "parallel_calls_between_text": (
        [
            TokenChunk(text="Checking."),
            *call(0, PARIS, '{"city": "Paris"}'),
            *call(1, ROME, '{"city"', ': "Rome"}'),
            TokenChunk(text="Done."),
            FinishChunk(finish_reason="tool_calls", usage=USAGE),
        ],
        [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": PARIS, "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": ROME, "name": "get_weather", "input": {"city": "Rome"}},
            {"type": "text", "text": "Done."},
        ],
        "tool_use",
    ),
    "forced_call_finishing_with_stop": (
        [*call(0, PARIS, '{"city": "Paris"}'), FinishChunk(finish_reason="stop", usage=USAGE)],
        [{"type": "tool_use", "id": PARIS, "name": "get_weather", "input": {"city": "Paris"}}],
        "tool_use",
    ),
    "max_tokens": (
        [TokenChunk(text="Once upon"), FinishChunk(finish_reason="length", usage=USAGE)],
        [{"type": "text", "text": "Once upon"}],
        "max_tokens",
    ),
    "stop_sequence": (
        [TokenChunk(text="a, b"), FinishChunk(finish_reason="stop", usage=USAGE, stop_sequence=", c")],
        [{"type": "text", "text": "a, b"}],
        "stop_sequence",
    ),
}


@pytest.fixture
def scripted() -> Iterator[tuple[Anthropic, ScriptedMaster]]:
    app, master = scripted_app()
    with TestClient(app) as http:
        yield Anthropic(base_url=str(http.base_url), api_key="unused", http_client=http, max_retries=0), master


def create(**extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": SCRIPTED_MODEL, "max_tokens": 100, "tools": TOOLS}
    return {**body, "messages": [{"role": "user", "content": "Weather?"}], **extra}


def sse_events(client: Anthropic, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The raw stream as (event name, data) pairs."""
    http = client._client  # pyright: ignore[reportPrivateUsage] - the TestClient the SDK was given
    response = http.post("/v1/messages", json={**body, "stream": True})
    assert response.status_code == 200, response.text
    events: list[tuple[str, dict[str, Any]]] = []
    for block in response.text.strip().split("\n\n"):
        name, data = block.split("\n")
        events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


def check_event_grammar(events: list[tuple[str, dict[str, Any]]]) -> None:
    """message_start, then blocks opened and closed one at a time in index order, then message_delta, message_stop."""
    assert all(name == data["type"] for name, data in events)
    names = [name for name, _ in events]
    assert names[0] == "message_start"
    assert names[-2:] == ["message_delta", "message_stop"]
    open_index: int | None = None
    next_index = 0
    for name, data in events[1:-2]:
        if name == "content_block_start":
            assert open_index is None
            assert data["index"] == next_index
            open_index = data["index"]
            next_index += 1
        elif name == "content_block_delta":
            assert data["index"] == open_index
        else:
            assert name == "content_block_stop"
            assert data["index"] == open_index
            open_index = None
    assert open_index is None


@pytest.mark.parametrize("name", SCRIPTS)
def test_stream_accumulates_to_the_non_streaming_message(name: str, scripted: tuple[Anthropic, ScriptedMaster]) -> None:
    client, master = scripted
    chunks, content, stop_reason = SCRIPTS[name]
    master.script = tuple(chunks)
    whole = client.messages.create(**create())
    with client.messages.stream(**create()) as stream:
        accumulated = stream.get_final_message()
    assert [block.model_dump(exclude_none=True) for block in whole.content] == content
    assert accumulated.model_dump(exclude={"id"}) == whole.model_dump(exclude={"id"})
    assert whole.stop_reason == stop_reason
    assert whole.stop_sequence == (", c" if name == "stop_sequence" else None)
    # Anthropic's three-part prompt count: what was read from exo's prefix cache is not in input_tokens.
    assert (whole.usage.input_tokens, whole.usage.cache_read_input_tokens, whole.usage.output_tokens) == (8, 4, 5)
    check_event_grammar(sse_events(client, create()))


def test_tool_input_streams_as_the_runner_parsed_it(scripted: tuple[Anthropic, ScriptedMaster]) -> None:
    client, master = scripted
    master.script = tuple(SCRIPTS["parallel_calls_between_text"][0])
    events = sse_events(client, create())
    starts = [data["content_block"] for name, data in events if name == "content_block_start"]
    assert starts[1] == {"type": "tool_use", "id": PARIS, "name": "get_weather", "input": {}}
    fragments = [
        data["delta"]["partial_json"] for _, data in events if data.get("delta", {}).get("type") == "input_json_delta"
    ]
    assert fragments == ['{"city": "Paris"}', '{"city"', ': "Rome"}']


def test_an_error_before_any_output_is_an_http_error_in_anthropic_shape(
    scripted: tuple[Anthropic, ScriptedMaster],
) -> None:
    client, master = scripted
    overflow = ErrorChunk(
        error="context_length_exceeded",
        message="the prompt is 5000 tokens but the model's context is 4096 tokens",
    )
    master.script = (overflow,)
    for stream in (False, True):
        with pytest.raises(BadRequestError) as raised:
            client.messages.create(**create(), stream=stream)
        assert raised.value.body == {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": f"prompt is too long: {overflow.message}"},
        }


def test_a_failure_mid_stream_is_an_error_event_the_sdk_raises(scripted: tuple[Anthropic, ScriptedMaster]) -> None:
    client, master = scripted
    master.script = (TokenChunk(text="Hi"), ErrorChunk(error="runner_crashed", message="the model runner crashed"))
    with (
        pytest.raises(APIStatusError, match="the model runner crashed"),
        client.messages.stream(**create()) as stream,
    ):
        stream.get_final_message()
    events = sse_events(client, create())
    assert events[-1] == (
        "error",
        {"type": "error", "error": {"type": "api_error", "message": "the model runner crashed"}},
    )
    with pytest.raises(APIStatusError) as raised:
        client.messages.create(**create())
    assert raised.value.status_code == 500


def test_validation_errors_and_unknown_models_use_anthropic_error_shape(
    scripted: tuple[Anthropic, ScriptedMaster],
) -> None:
    client, master = scripted
    with pytest.raises(BadRequestError) as bad:
        client.messages.create(**create(), extra_body={"max_tokens": "many"})
    assert bad.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: Input should be a valid integer"},
    }
    with pytest.raises(NotFoundError) as missing:
        client.messages.create(**create(model="claude-opus-4"))
    assert missing.value.body["error"]["type"] == "not_found_error"  # pyright: ignore[reportIndexIssue, reportOptionalSubscript, reportCallIssue, reportArgumentType]
    assert master.tasks == []


def test_count_tokens_reports_the_runner_count(scripted: tuple[Anthropic, ScriptedMaster]) -> None:
    client, master = scripted
    master.script = (FinishChunk(finish_reason="stop", usage=Usage(prompt_tokens=321, completion_tokens=0)),)
    count = client.messages.count_tokens(
        model=SCRIPTED_MODEL, messages=[{"role": "user", "content": "hi"}], tools=TOOLS
    )
    assert count.input_tokens == 321
    assert master.tasks[-1].params.count_prompt_only


def test_an_anthropic_api_key_header_is_accepted_and_guard_refusals_use_anthropic_shape() -> None:
    app, master = scripted_app(NodeConfig(api_key="secret", max_request_bytes=4096))
    with TestClient(app) as http:
        accepted = Anthropic(base_url=str(http.base_url), api_key="secret", http_client=http, max_retries=0)
        assert accepted.messages.create(**create()).content
        refused = Anthropic(base_url=str(http.base_url), api_key="wrong", http_client=http, max_retries=0)
        with pytest.raises(AuthenticationError) as unauthorized:
            refused.messages.create(**create())
        assert unauthorized.value.body == {
            "type": "error",
            "error": {"type": "authentication_error", "message": "missing or invalid API key"},
        }
        with pytest.raises(APIStatusError) as too_large:
            accepted.messages.create(**create(system="x" * 5000))
        assert too_large.value.status_code == 413
        assert too_large.value.body["error"]["type"] == "request_too_large"  # pyright: ignore[reportIndexIssue, reportOptionalSubscript, reportCallIssue, reportArgumentType]
        with pytest.raises(BadRequestError) as unpassable:
            accepted.messages.create(**create(messages=[{"role": "user", "content": "nul \u0000 here"}]))
        assert unpassable.value.body["type"] == "error"  # pyright: ignore[reportIndexIssue, reportOptionalSubscript, reportCallIssue, reportArgumentType]
        assert "messages[0].content" in unpassable.value.body["error"]["message"]  # pyright: ignore[reportIndexIssue, reportOptionalSubscript, reportCallIssue, reportArgumentType]
    assert len(master.tasks) == 1
