"""The Messages API through the whole node: real exo subprocess, runner, MLX, tool parser, official `anthropic` SDK.

The fixture model answers fixed prompts with fixed greedy outputs (tests/fixtures/fixture_specs.py); the same
prompts sent in Anthropic's dialect must give the same answers Chat Completions gives, as tool_use blocks.
"""

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest
from anthropic import Anthropic, BadRequestError, NotFoundError
from anthropic.types import Message, ToolUseBlock

from tests.exo_server import ExoServer, fixture_model, running_exo
from tests.fixtures.fixture_specs import GET_WEATHER_TOOL, GREETING_REPLY, PARIS_WEATHER_ANSWER, PARIS_WEATHER_RESULT

QWEN = "tiny-qwen-tools"
WEATHER_FUNCTION: dict[str, Any] = GET_WEATHER_TOOL["function"]  # pyright: ignore[reportAssignmentType]
WEATHER: dict[str, Any] = {
    "name": WEATHER_FUNCTION["name"],
    "description": WEATHER_FUNCTION["description"],
    "input_schema": WEATHER_FUNCTION["parameters"],
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    with running_exo([fixture_model(QWEN)], tmp_path_factory.mktemp("exo-messages")) as running:
        yield running


@pytest.fixture
def client(server: ExoServer) -> Anthropic:
    return server.anthropic_client()


def ask(question: str, **extra: Any) -> dict[str, Any]:
    return {"model": QWEN, "max_tokens": 200, "messages": [{"role": "user", "content": question}], **extra}


def comparable(message: Message) -> dict[str, Any]:
    """The message without what differs between two requests: ids (random) and usage (the prefix cache)."""
    blocks = [block.model_dump(exclude={"id"}, exclude_none=True) for block in message.content]
    return {**message.model_dump(exclude={"id", "usage", "content"}), "content": blocks}


def both(client: Anthropic, request: dict[str, Any]) -> tuple[Message, Message]:
    """The non-streaming message and the one the SDK accumulates from the stream: they must be equal."""
    whole = client.messages.create(**request)
    with client.messages.stream(**request) as stream:
        accumulated = stream.get_final_message()
    assert comparable(accumulated) == comparable(whole)
    total = whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0)
    assert accumulated.usage.input_tokens + (accumulated.usage.cache_read_input_tokens or 0) == total
    assert accumulated.usage.output_tokens == whole.usage.output_tokens
    return whole, accumulated


def tool_uses(message: Message) -> list[tuple[str, object]]:
    return [(block.name, block.input) for block in message.content if isinstance(block, ToolUseBlock)]


def test_plain_text_answers_with_the_fixture_greeting(client: Anthropic) -> None:
    whole, accumulated = both(client, ask("Hello!"))
    for message in (whole, accumulated):
        assert [block.model_dump(exclude_none=True) for block in message.content] == [
            {"type": "text", "text": GREETING_REPLY}
        ]
        assert message.stop_reason == "end_turn"
        assert message.usage.output_tokens > 0
    prompt = whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0)
    assert (
        client.messages.count_tokens(
            **{key: value for key, value in ask("Hello!").items() if key != "max_tokens"}
        ).input_tokens
        == prompt
    )


def test_one_tool_call_streams_its_input_in_fragments(client: Anthropic, server: ExoServer) -> None:
    request = ask("What is the weather in Paris?", tools=[WEATHER])
    whole, accumulated = both(client, request)
    for message in (whole, accumulated):
        assert tool_uses(message) == [("get_weather", {"city": "Paris"})]
        assert message.stop_reason == "tool_use"
        assert not [block for block in message.content if block.type == "text"]  # no marker leaks into text
    raw = httpx.post(f"{server.base_url}/v1/messages", json={**request, "stream": True}, timeout=120)
    fragments = [
        json.loads(line.removeprefix("data: "))["delta"]["partial_json"]
        for line in raw.text.splitlines()
        if line.startswith("data: ") and '"input_json_delta"' in line
    ]
    assert len(fragments) > 1, fragments  # streamed as the model wrote it, not in one piece at the end
    assert json.loads("".join(fragments)) == {"city": "Paris"}


def test_parallel_calls_are_separate_blocks_unless_parallel_use_is_disabled(client: Anthropic) -> None:
    request = ask("What is the weather in Paris and Tokyo?", tools=[WEATHER])
    whole, _ = both(client, request)
    assert tool_uses(whole) == [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Tokyo"})]
    ids = [block.id for block in whole.content if isinstance(block, ToolUseBlock)]
    assert len(set(ids)) == 2
    single, _ = both(client, {**request, "tool_choice": {"type": "auto", "disable_parallel_tool_use": True}})
    assert tool_uses(single) == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}])
def test_forced_tool_choice_calls_the_tool_where_the_model_would_chat(
    client: Anthropic, choice: dict[str, Any]
) -> None:
    # As much room as the context leaves (exo clamps it): the grammar lets the model write arguments until it stops.
    whole, accumulated = both(client, ask("Hello!", tools=[WEATHER], tool_choice=choice, max_tokens=4096))
    for message in (whole, accumulated):
        calls = tool_uses(message)
        assert calls, message.content
        for name, arguments in calls:
            assert name == "get_weather"
            jsonschema.validate(arguments, WEATHER["input_schema"])
        assert message.stop_reason == "tool_use"


def test_tool_choice_none_answers_without_calls(client: Anthropic) -> None:
    whole, _ = both(client, ask("What is the weather in Paris?", tools=[WEATHER], tool_choice={"type": "none"}))
    assert tool_uses(whole) == []
    assert whole.stop_reason != "tool_use"


def test_a_tool_result_turn_leads_to_the_fixture_answer(client: Anthropic) -> None:
    call = ask("What is the weather in Paris?", tools=[WEATHER])
    first = client.messages.create(**call)
    history = [
        *call["messages"],
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": first.content[0].id, "content": PARIS_WEATHER_RESULT}],  # pyright: ignore[reportAttributeAccessIssue]
        },
    ]
    whole, accumulated = both(client, {**call, "messages": history})
    for message in (whole, accumulated):
        assert [block.model_dump(exclude_none=True) for block in message.content] == [
            {"type": "text", "text": PARIS_WEATHER_ANSWER}
        ]
        assert message.stop_reason == "end_turn"


def test_errors_are_raised_by_the_sdk_as_errors_and_the_server_keeps_serving(client: Anthropic) -> None:
    with pytest.raises(NotFoundError):
        client.messages.create(**ask("Hello!", model="not-a-served-model"))
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(BadRequestError, match="image input"):
        client.messages.create(**ask("Hello!", messages=[{"role": "user", "content": [image]}]))
    for stream in (False, True):
        with pytest.raises(BadRequestError, match="prompt is too long") as raised:
            client.messages.create(**ask("weather " * 5000), stream=stream)
        assert raised.value.body["error"]["type"] == "invalid_request_error"  # pyright: ignore[reportIndexIssue, reportOptionalSubscript, reportCallIssue, reportArgumentType]
    assert client.messages.create(**ask("Hello!")).content[0].text == GREETING_REPLY  # pyright: ignore[reportAttributeAccessIssue]
