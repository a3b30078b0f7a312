"""/v1/responses through the official `openai` SDK against the production app (scripted runner chunks).

Every chunk sequence a runner can send is streamed and collected; the SDK's stream accumulator must end with
exactly the non-streaming response, and the raw events must follow the Responses API's event grammar.
"""

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from openai import BadRequestError, OpenAI
from openai.types.responses import Response

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

USAGE = Usage(prompt_tokens=12, completion_tokens=5, cached_tokens=4, reasoning_tokens=2)
PARIS = ToolCallId("call_aaaaaaaaaaaaaaaaaaaaaaa1")
ROME = ToolCallId("call_aaaaaaaaaaaaaaaaaaaaaaa2")
TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "strict": False,
    }
]


def call(index: int, call_id: ToolCallId, *fragments: str) -> list[Chunk]:
    return [
        ToolCallChunk(index=index, call_id=call_id, name="get_weather"),
        *(ToolCallArgumentsChunk(index=index, fragment=fragment) for fragment in fragments),
    ]


def message(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def function_call(call_id: str, arguments: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "call_id": call_id,
        "name": "get_weather",
        "arguments": arguments,
        "status": "completed",
    }


SCRIPTS: dict[str, tuple[list[Chunk], list[dict[str, Any]]]] = {
    "text": (
        [TokenChunk(text="Hel"), TokenChunk(text="lo!"), FinishChunk(finish_reason="stop", usage=USAGE)],
        [message("Hello!")],
    ),
    "reasoning_then_text": (
        [
            ReasoningChunk(text="The user "),
            ReasoningChunk(text="greets."),
            TokenChunk(text="Hi"),
            FinishChunk(finish_reason="stop", usage=USAGE),
        ],
        [
            {
                "type": "reasoning",
                "status": "completed",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "The user greets."}],
            },
            message("Hi"),
        ],
    ),
    "one_call": (
        [*call(0, PARIS, '{"city": ', '"Paris"}'), FinishChunk(finish_reason="tool_calls", usage=USAGE)],
        [function_call(PARIS, '{"city": "Paris"}')],
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
            message("Checking."),
            function_call(PARIS, '{"city": "Paris"}'),
            function_call(ROME, '{"city": "Rome"}'),
            message("Done."),
        ],
    ),
}


@pytest.fixture
def scripted() -> Iterator[tuple[OpenAI, ScriptedMaster]]:
    app, master = scripted_app()
    with TestClient(app) as http:
        yield OpenAI(base_url=f"{http.base_url}/v1", api_key="unused", http_client=http, max_retries=0), master


def create(**extra: Any) -> dict[str, Any]:
    return {"model": SCRIPTED_MODEL, "input": "Weather?", "tools": TOOLS, **extra}


def without_ids(response: Response) -> list[dict[str, Any]]:
    return [item.model_dump(exclude={"id"}, exclude_none=True) for item in response.output]


def sse_events(client: OpenAI, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    http = client._client  # pyright: ignore[reportPrivateUsage] - the TestClient the SDK was given
    response = http.post("/v1/responses", json={**body, "stream": True})
    assert response.status_code == 200, response.text
    events: list[tuple[str, dict[str, Any]]] = []
    for block in response.text.strip().split("\n\n"):
        name, data = block.split("\n")
        events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


def check_event_grammar(events: list[tuple[str, dict[str, Any]]], final: str) -> None:
    """Numbered in order; created, in_progress, then items added, streamed and done one at a time; then `final`."""
    assert all(name == data["type"] for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    names = [name for name, _ in events]
    assert names[:2] == ["response.created", "response.in_progress"]
    assert names[-1] == final
    open_item: str | None = None
    for name, data in events[2:-1]:
        if name == "response.output_item.added":
            assert open_item is None
            open_item = data["item"]["id"]
        elif name == "response.output_item.done":
            assert data["item"]["id"] == open_item
            open_item = None
        else:
            assert data["item_id"] == open_item
    assert open_item is None


@pytest.mark.parametrize("name", SCRIPTS)
def test_stream_accumulates_to_the_non_streaming_response(name: str, scripted: tuple[OpenAI, ScriptedMaster]) -> None:
    client, master = scripted
    chunks, output = SCRIPTS[name]
    master.script = tuple(chunks)
    whole = client.responses.create(**create())
    with client.responses.stream(**create()) as stream:
        accumulated = stream.get_final_response()
    assert without_ids(whole) == output
    assert without_ids(accumulated) == without_ids(whole)
    assert whole.status == accumulated.status == "completed"
    assert whole.usage is not None
    assert whole.usage.model_dump(exclude_none=True) == {
        "input_tokens": 12,
        "input_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 2},
        "total_tokens": 17,
    }
    check_event_grammar(sse_events(client, create()), "response.completed")


def test_arguments_stream_as_the_runner_parsed_them(scripted: tuple[OpenAI, ScriptedMaster]) -> None:
    client, master = scripted
    master.script = tuple(SCRIPTS["parallel_calls_between_text"][0])
    events = sse_events(client, create())
    added = [data["item"] for name, data in events if name == "response.output_item.added"]
    assert added[1] == {
        "type": "function_call",
        "id": added[1]["id"],
        "call_id": PARIS,
        "name": "get_weather",
        "arguments": "",
        "status": "in_progress",
    }
    deltas = [data["delta"] for name, data in events if name == "response.function_call_arguments.delta"]
    assert deltas == ['{"city": "Paris"}', '{"city"', ': "Rome"}']


def test_max_output_tokens_ends_incomplete(scripted: tuple[OpenAI, ScriptedMaster]) -> None:
    client, master = scripted
    master.script = (TokenChunk(text="Once upon"), FinishChunk(finish_reason="length", usage=USAGE))
    whole = client.responses.create(**create(max_output_tokens=2))
    assert whole.status == "incomplete"
    assert whole.incomplete_details is not None
    assert whole.incomplete_details.reason == "max_output_tokens"
    assert whole.output_text == "Once upon"
    events = sse_events(client, create(max_output_tokens=2))
    check_event_grammar(events, "response.incomplete")
    assert events[-1][1]["response"]["output"][0]["status"] == "incomplete"


def test_an_error_before_any_output_is_an_http_error(scripted: tuple[OpenAI, ScriptedMaster]) -> None:
    client, master = scripted
    master.script = (ErrorChunk(error="context_length_exceeded", message="too long"),)
    for stream in (False, True):
        with pytest.raises(BadRequestError) as raised:
            client.responses.create(**create(stream=stream))
        assert raised.value.code == "context_length_exceeded"


def test_a_failure_mid_stream_ends_with_response_failed(scripted: tuple[OpenAI, ScriptedMaster]) -> None:
    client, master = scripted
    master.script = (TokenChunk(text="Hi"), ErrorChunk(error="runner_crashed", message="the model runner crashed"))
    events = sse_events(client, create())
    check_event_grammar(events, "response.failed")
    failed = events[-1][1]["response"]
    assert failed["status"] == "failed"
    assert failed["error"] == {"code": "server_error", "message": "the model runner crashed"}
    assert failed["output"][0]["status"] == "incomplete"


def test_input_tokens_reports_the_runner_count(scripted: tuple[OpenAI, ScriptedMaster]) -> None:
    client, master = scripted
    master.script = (FinishChunk(finish_reason="stop", usage=Usage(prompt_tokens=321, completion_tokens=0)),)
    count = client.responses.input_tokens.count(model=SCRIPTED_MODEL, input="hi", tools=TOOLS)
    assert count.input_tokens == 321
    assert master.tasks[-1].params.count_prompt_only


def test_the_response_echoes_the_request_settings(scripted: tuple[OpenAI, ScriptedMaster]) -> None:
    client, _ = scripted
    response = client.responses.create(
        **create(instructions="Be brief.", tool_choice="required", parallel_tool_calls=False, temperature=0.3)
    )
    assert (response.instructions, response.tool_choice, response.parallel_tool_calls) == (
        "Be brief.",
        "required",
        False,
    )
    assert response.temperature == 0.3
    assert [tool.model_dump(exclude_none=True) for tool in response.tools] == TOOLS
