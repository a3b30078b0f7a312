"""The Responses API through the whole node: real exo subprocess, runner, MLX, tool parser, official `openai` SDK.

The fixture model answers fixed prompts with fixed greedy outputs (tests/fixtures/fixture_specs.py); the same
prompts sent as Responses input items must give the same answers Chat Completions gives, as function_call items.
"""

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest
from openai import BadRequestError, NotFoundError, OpenAI
from openai.types.responses import Response, ResponseFunctionToolCall

from tests.exo_server import ExoServer, fixture_model, running_exo
from tests.fixtures.fixture_specs import GET_WEATHER_TOOL, GREETING_REPLY, PARIS_WEATHER_ANSWER, PARIS_WEATHER_RESULT

QWEN = "tiny-qwen-tools"
WEATHER_FUNCTION: dict[str, Any] = GET_WEATHER_TOOL["function"]  # pyright: ignore[reportAssignmentType]
WEATHER: dict[str, Any] = {"type": "function", **WEATHER_FUNCTION, "strict": False}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    with running_exo([fixture_model(QWEN)], tmp_path_factory.mktemp("exo-responses")) as running:
        yield running


@pytest.fixture
def client(server: ExoServer) -> OpenAI:
    return server.openai_client()


def ask(question: str, **extra: Any) -> dict[str, Any]:
    return {"model": QWEN, "input": question, **extra}


def comparable(response: Response) -> list[dict[str, Any]]:
    """The output without what differs between two requests: item and call ids are random."""
    return [item.model_dump(exclude={"id", "call_id"}, exclude_none=True) for item in response.output]


def both(client: OpenAI, request: dict[str, Any]) -> tuple[Response, Response]:
    """The non-streaming response and the one the SDK accumulates from the stream: they must agree."""
    whole = client.responses.create(**request)
    with client.responses.stream(**request) as stream:
        accumulated = stream.get_final_response()
    assert comparable(accumulated) == comparable(whole)
    assert accumulated.status == whole.status
    assert whole.usage is not None
    assert accumulated.usage is not None
    assert (accumulated.usage.input_tokens, accumulated.usage.output_tokens) == (
        whole.usage.input_tokens,
        whole.usage.output_tokens,
    )
    return whole, accumulated


def calls(response: Response) -> list[tuple[str, object]]:
    return [
        (item.name, json.loads(item.arguments))
        for item in response.output
        if isinstance(item, ResponseFunctionToolCall)
    ]


def test_plain_text_answers_with_the_fixture_greeting(client: OpenAI) -> None:
    whole, accumulated = both(client, ask("Hello!"))
    for response in (whole, accumulated):
        assert response.output_text == GREETING_REPLY
        assert response.status == "completed"
    assert whole.usage is not None
    counted = client.responses.input_tokens.count(model=QWEN, input="Hello!")
    assert counted.input_tokens == whole.usage.input_tokens


def test_one_function_call_streams_its_arguments_in_fragments(client: OpenAI, server: ExoServer) -> None:
    request = ask("What is the weather in Paris?", tools=[WEATHER])
    whole, accumulated = both(client, request)
    for response in (whole, accumulated):
        assert calls(response) == [("get_weather", {"city": "Paris"})]
        assert response.output_text == ""  # no marker leaks into a message item
    raw = httpx.post(f"{server.base_url}/v1/responses", json={**request, "stream": True}, timeout=120)
    fragments = [
        json.loads(line.removeprefix("data: "))["delta"]
        for line in raw.text.splitlines()
        if line.startswith("data: ") and '"response.function_call_arguments.delta"' in line
    ]
    assert len(fragments) > 1, fragments  # streamed as the model wrote it, not in one piece at the end
    assert json.loads("".join(fragments)) == {"city": "Paris"}


def test_parallel_calls_are_separate_items_unless_parallel_tool_calls_is_false(client: OpenAI) -> None:
    request = ask("What is the weather in Paris and Tokyo?", tools=[WEATHER])
    whole, _ = both(client, request)
    assert calls(whole) == [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Tokyo"})]
    call_ids = [item.call_id for item in whole.output if isinstance(item, ResponseFunctionToolCall)]
    assert len(set(call_ids)) == 2
    single, _ = both(client, {**request, "parallel_tool_calls": False})
    assert calls(single) == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_weather"}])
def test_forced_tool_choice_calls_the_tool_where_the_model_would_chat(client: OpenAI, choice: object) -> None:
    whole, accumulated = both(client, ask("Hello!", tools=[WEATHER], tool_choice=choice))
    for response in (whole, accumulated):
        found = calls(response)
        assert found, response.output
        for name, arguments in found:
            assert name == "get_weather"
            jsonschema.validate(arguments, WEATHER["parameters"])


def test_tool_choice_none_answers_without_calls(client: OpenAI) -> None:
    whole, _ = both(client, ask("What is the weather in Paris?", tools=[WEATHER], tool_choice="none"))
    assert calls(whole) == []


def test_function_call_output_leads_to_the_fixture_answer(client: OpenAI) -> None:
    first = client.responses.create(**ask("What is the weather in Paris?", tools=[WEATHER]))
    call = first.output[0]
    assert isinstance(call, ResponseFunctionToolCall)
    history: list[Any] = [
        {"role": "user", "content": "What is the weather in Paris?"},
        *[item.model_dump(exclude_none=True) for item in first.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": PARIS_WEATHER_RESULT},
    ]
    whole, accumulated = both(client, {"model": QWEN, "input": history, "tools": [WEATHER]})
    for response in (whole, accumulated):
        assert response.output_text == PARIS_WEATHER_ANSWER


def test_errors_are_raised_by_the_sdk_as_errors_and_the_server_keeps_serving(client: OpenAI) -> None:
    with pytest.raises(NotFoundError):
        client.responses.create(**ask("Hello!", model="not-a-served-model"))
    with pytest.raises(BadRequestError, match="web_search"):
        client.responses.create(**ask("Hello!", tools=[{"type": "web_search"}]))
    with pytest.raises(BadRequestError, match="previous_response_id"):
        client.responses.create(**ask("Hello!", previous_response_id="resp_123"))
    for stream in (False, True):
        with pytest.raises(BadRequestError) as raised:
            client.responses.create(**ask("weather " * 5000, stream=stream))
        assert raised.value.code == "context_length_exceeded"
    assert client.responses.create(**ask("Hello!")).output_text == GREETING_REPLY
