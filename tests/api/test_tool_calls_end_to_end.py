"""Tool calling through the whole node: real exo subprocess, runner, MLX forward passes, parser, SSE, openai SDK.

The fixture models answer fixed prompts with fixed greedy outputs (tests/fixtures/fixture_specs.py), so every
expectation below follows from the model's known text and the documented parser rules.
"""

import json
import re
from collections.abc import Iterator
from typing import Any, cast

import httpx
import jsonschema
import pytest
from openai import OpenAI
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionMessageParam,
    ChatCompletionToolParam,
)

from tests.exo_server import ExoServer, fixture_model, running_exo
from tests.fixtures.fixture_specs import (
    GET_TIME_TOOL,
    GET_WEATHER_TOOL,
    GREETING_REPLY,
    PARIS_WEATHER_ANSWER,
    PARIS_WEATHER_RESULT,
    JsonObject,
    user,
)

QWEN = "tiny-qwen-tools"
LLAMA = "tiny-llama31-tools"
CALL_ID_PATTERN = r"^call_[A-Za-z0-9]{24}$"
WEATHER_SCHEMA = cast(dict[str, Any], GET_WEATHER_TOOL["function"])["parameters"]
ENUM_WEATHER_TOOL: JsonObject = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Rome", "Oslo"]}, "days": {"type": "integer"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    models = [fixture_model(QWEN), fixture_model(LLAMA)]
    with running_exo(models, tmp_path_factory.mktemp("exo-tools")) as running:
        yield running


@pytest.fixture
def client(server: ExoServer) -> OpenAI:
    return server.openai_client()


def tools(*definitions: JsonObject) -> list[ChatCompletionToolParam]:
    return [cast(ChatCompletionToolParam, definition) for definition in definitions]


def messages(*items: JsonObject) -> list[ChatCompletionMessageParam]:
    return [cast(ChatCompletionMessageParam, item) for item in items]


def sse_chunks(server: ExoServer, body: dict[str, Any]) -> list[dict[str, Any]]:
    """POST a streaming request and return the decoded chunks (checking the `[DONE]` terminator)."""
    response = httpx.post(f"{server.base_url}/v1/chat/completions", json={**body, "stream": True}, timeout=120)
    assert response.status_code == 200, response.text
    payloads = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
    assert payloads[-1] == "[DONE]"
    return [json.loads(payload) for payload in payloads[:-1]]


def tool_call_deltas(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [call for chunk in chunks for choice in chunk["choices"] for call in choice["delta"].get("tool_calls", [])]


def function_calls(completion: ChatCompletion) -> list[ChatCompletionMessageFunctionToolCall]:
    calls = completion.choices[0].message.tool_calls or []
    assert all(isinstance(call, ChatCompletionMessageFunctionToolCall) for call in calls)
    return [call for call in calls if isinstance(call, ChatCompletionMessageFunctionToolCall)]


def calls_of(completion: ChatCompletion) -> list[tuple[str, JsonObject]]:
    return [(call.function.name, json.loads(call.function.arguments)) for call in function_calls(completion)]


def streamed(client: OpenAI, **request: Any) -> ChatCompletion:
    """The SDK's own accumulation of a streamed response (what strict clients rebuild from the deltas)."""
    with client.chat.completions.stream(**request) as stream:
        for _ in stream:
            pass
        return stream.get_final_completion()


@pytest.mark.parametrize(
    ("model", "question", "expected_calls"),
    [
        (QWEN, "What is the weather in Paris?", [("get_weather", {"city": "Paris"})]),
        (
            QWEN,
            "What is the weather in Paris and Tokyo?",
            [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Tokyo"})],
        ),
        (LLAMA, "What is the weather in Paris?", [("get_weather", {"city": "Paris"})]),  # <|python_tag|> … <|eom_id|>
        (LLAMA, "What time is it in Tokyo?", [("get_time", {"timezone": "Asia/Tokyo"})]),  # bare JSON reply
    ],
)
def test_tool_calls_stream_and_non_stream_agree_with_the_model_output(
    client: OpenAI, model: str, question: str, expected_calls: list[tuple[str, JsonObject]]
) -> None:
    offered = tools(GET_WEATHER_TOOL, GET_TIME_TOOL) if model == LLAMA else tools(GET_WEATHER_TOOL)
    request: dict[str, Any] = {"model": model, "messages": messages(user(question)), "tools": offered}
    whole = client.chat.completions.create(**request)
    accumulated = streamed(client, **request)
    for completion in (whole, accumulated):
        choice = completion.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert not choice.message.content  # no marker or JSON leaks into content
        assert calls_of(completion) == expected_calls
        ids = [call.id for call in choice.message.tool_calls or []]
        assert len(set(ids)) == len(ids)
        for call_id in ids:
            assert re.fullmatch(CALL_ID_PATTERN, call_id)


def test_streamed_call_sends_the_name_first_then_argument_fragments_without_repeating_fields(
    server: ExoServer,
) -> None:
    chunks = sse_chunks(
        server,
        {
            "model": QWEN,
            "messages": [user("What is the weather in Paris and Tokyo?")],
            "tools": [GET_WEATHER_TOOL],
        },
    )
    deltas = tool_call_deltas(chunks)
    for index in (0, 1):
        own = [delta for delta in deltas if delta["index"] == index]
        first, rest = own[0], own[1:]
        assert first["type"] == "function"
        assert first["function"] == {"name": "get_weather", "arguments": ""}
        assert len(rest) > 1, "arguments must stream as several fragments, not one blob"
        for delta in rest:
            assert set(delta) == {"index", "function"}
            assert set(delta["function"]) == {"arguments"}
        joined = "".join(delta["function"]["arguments"] for delta in rest)
        jsonschema.validate(json.loads(joined), WEATHER_SCHEMA)
        for cut in range(1, len(joined)):
            with pytest.raises(json.JSONDecodeError):
                json.loads(joined[:cut])
    roles = [chunk for chunk in chunks if chunk["choices"] and "role" in chunk["choices"][0]["delta"]]
    assert len(roles) == 1
    finishes = [chunk["choices"][0]["finish_reason"] for chunk in chunks if chunk["choices"]]
    assert finishes[-1] == "tool_calls"
    assert all(reason is None for reason in finishes[:-1])


def test_a_full_tool_loop_with_sdk_messages_reaches_the_answer(client: OpenAI) -> None:
    history = messages(user("What is the weather in Paris?"))
    first = streamed(client, model=QWEN, messages=history, tools=tools(GET_WEATHER_TOOL))
    message = first.choices[0].message
    assert message.tool_calls
    call = message.tool_calls[0]
    history.append(cast(ChatCompletionMessageParam, message.model_dump(exclude_none=True, exclude={"parsed"})))
    history.append({"role": "tool", "tool_call_id": call.id, "content": PARIS_WEATHER_RESULT})
    second = streamed(client, model=QWEN, messages=history, tools=tools(GET_WEATHER_TOOL))
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == PARIS_WEATHER_ANSWER
    assert second.choices[0].message.tool_calls in (None, [])


def test_llama_tool_result_turn_is_rendered_for_the_template(client: OpenAI) -> None:
    history: list[JsonObject] = [
        user("What is the weather in Paris?"),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_abc",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_abc", "content": PARIS_WEATHER_RESULT},
    ]
    completion = client.chat.completions.create(
        model=LLAMA, messages=messages(*history), tools=tools(GET_WEATHER_TOOL, GET_TIME_TOOL)
    )
    assert completion.choices[0].message.content == PARIS_WEATHER_ANSWER


def test_plain_answers_and_requested_json_stay_content(client: OpenAI) -> None:
    greeting = client.chat.completions.create(
        model=QWEN, messages=messages(user("Hello!")), tools=tools(GET_WEATHER_TOOL)
    )
    assert greeting.choices[0].message.content == GREETING_REPLY
    assert greeting.choices[0].finish_reason == "stop"
    asked_json = streamed(
        client,
        model=QWEN,
        messages=messages(user("Write a JSON object with a key a set to 1.")),
        tools=tools(GET_WEATHER_TOOL),
    )
    assert asked_json.choices[0].message.content == '{"a": 1}'
    assert not asked_json.choices[0].message.tool_calls
    assert asked_json.choices[0].finish_reason == "stop"


# The failure rule is what a reply gets where no grammar held the call and no repair re-decoded it: the lazy "auto"
# grammar and the repair turned off (tests/api/test_tool_call_repair_end_to_end.py repairs these same calls).
UNHELD = {"extra_body": {"auto_tool_grammar": False, "tool_call_repair": False}}


def test_a_call_to_an_unknown_tool_comes_back_as_content(client: OpenAI, server: ExoServer) -> None:
    # The model calls get_time, which this request does not offer: the documented rule returns the raw text.
    request: dict[str, Any] = {
        "model": QWEN,
        "messages": messages(user("What time is it in Tokyo?")),
        "tools": tools(GET_WEATHER_TOOL),
        **UNHELD,
    }
    for completion in (client.chat.completions.create(**request), streamed(client, **request)):
        choice = completion.choices[0]
        assert choice.finish_reason == "stop"
        assert not choice.message.tool_calls
        assert choice.message.content is not None
        assert '"name": "get_time"' in choice.message.content
        assert choice.message.content.startswith("<tool_call>")
    assert "unknown tool 'get_time'" in server.log()


def test_malformed_arguments_keep_the_committed_call_and_its_raw_text(client: OpenAI, server: ExoServer) -> None:
    # The model writes `{"city": }`: the name was valid, so the call stands with the model's own text (rule: never
    # dropped, never invented), and the log says why.
    request: dict[str, Any] = {
        "model": QWEN,
        "messages": messages(user("Break the tool.")),
        "tools": tools(GET_WEATHER_TOOL),
        **UNHELD,
    }
    for completion in (client.chat.completions.create(**request), streamed(client, **request)):
        tool_calls = function_calls(completion)
        assert [call.function.name for call in tool_calls] == ["get_weather"]
        assert tool_calls[0].function.arguments.startswith('{"city": }')
    assert "arguments are not valid JSON" in server.log()


@pytest.mark.parametrize(
    ("question", "tool"),
    [
        ("What time is it in Tokyo?", GET_WEATHER_TOOL),  # trained to call get_time, which is not offered
        ("Break the tool.", GET_WEATHER_TOOL),  # trained to write `{"city": }`
        ("What is the weather in Paris?", ENUM_WEATHER_TOOL),  # trained to write "Paris", which the enum lacks
    ],
)
def test_under_auto_every_call_the_misbehaving_model_makes_validates(
    client: OpenAI, question: str, tool: JsonObject
) -> None:
    # The same trained answers as above, with the lazy grammar on (the default): once the model opens a call, the
    # call is held to the offered tools and their schemas, so whatever comes back as a call validates.
    request: dict[str, Any] = {"model": QWEN, "messages": messages(user(question)), "tools": tools(tool)}
    schema = cast(dict[str, Any], tool["function"])["parameters"]
    for completion in (client.chat.completions.create(**request), streamed(client, **request)):
        for call in function_calls(completion):
            assert call.function.name == "get_weather"
            jsonschema.validate(json.loads(call.function.arguments), schema)
        assert "<tool_call>" not in (completion.choices[0].message.content or "")


def test_max_tokens_inside_a_call_finishes_with_length_and_keeps_the_partial_arguments(
    client: OpenAI, server: ExoServer
) -> None:
    request: dict[str, Any] = {
        "model": QWEN,
        "messages": [user("What is the weather in Paris?")],
        "tools": [GET_WEATHER_TOOL],
        "max_tokens": 15,  # <tool_call>, \n, {", name, ":, ␣", get, _weather, ", ␣", arguments, ":, ␣{", city, ":
    }
    # The SDK's stream helper refuses "length" results, so the stream is read raw.
    chunks = sse_chunks(server, request)
    streamed_arguments = "".join(delta["function"]["arguments"] for delta in tool_call_deltas(chunks))
    streamed_finish = [chunk["choices"][0]["finish_reason"] for chunk in chunks if chunk["choices"]][-1]
    whole = client.chat.completions.create(**request)
    assert whole.usage is not None
    assert whole.usage.completion_tokens == 15
    assert whole.choices[0].finish_reason == streamed_finish == "length"
    whole_arguments = "".join(call.function.arguments for call in function_calls(whole))
    # The call committed once its name was read; its arguments are the model's text as far as it went.
    assert whole_arguments == streamed_arguments
    assert len(whole_arguments) > 2
    assert '{"city": "Paris"}'.startswith(whole_arguments)
    with pytest.raises(json.JSONDecodeError):
        json.loads(whole_arguments)


def test_parallel_tool_calls_false_returns_only_the_first_call(client: OpenAI) -> None:
    request: dict[str, Any] = {
        "model": QWEN,
        "messages": messages(user("What is the weather in Paris and Tokyo?")),
        "tools": tools(GET_WEATHER_TOOL),
        "parallel_tool_calls": False,
    }
    for completion in (client.chat.completions.create(**request), streamed(client, **request)):
        assert calls_of(completion) == [("get_weather", {"city": "Paris"})]
        assert completion.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("stream", [False, True])
def test_tool_choice_required_forces_a_schema_valid_call_where_the_model_would_chat(
    client: OpenAI, stream: bool
) -> None:
    request: dict[str, Any] = {
        "model": QWEN,
        "messages": messages(user("Hello!")),
        "tools": tools(GET_WEATHER_TOOL),
        "tool_choice": "required",
    }
    completion = streamed(client, **request) if stream else client.chat.completions.create(**request)
    found = calls_of(completion)
    assert found, completion.choices[0].message.content
    for name, arguments in found:
        assert name == "get_weather"
        jsonschema.validate(arguments, WEATHER_SCHEMA)
    assert completion.choices[0].finish_reason == "tool_calls"


def test_named_tool_choice_calls_that_tool_and_finishes_with_tool_calls(client: OpenAI) -> None:
    completion = client.chat.completions.create(
        model=QWEN,
        messages=messages(user("Hello!")),
        tools=tools(GET_WEATHER_TOOL, GET_TIME_TOOL),
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )
    found = calls_of(completion)
    assert [name for name, _ in found] == ["get_time"]
    jsonschema.validate(found[0][1], cast(dict[str, Any], GET_TIME_TOOL["function"])["parameters"])
    # The finish reason matches the message (OpenAI answers "stop" here, which agent loops stop on: issue 37).
    assert completion.choices[0].finish_reason == "tool_calls"


def test_tool_choice_none_never_returns_calls(client: OpenAI) -> None:
    completion = client.chat.completions.create(
        model=QWEN,
        messages=messages(user("What is the weather in Paris?")),
        tools=tools(GET_WEATHER_TOOL),
        tool_choice="none",
    )
    assert not completion.choices[0].message.tool_calls
    assert completion.choices[0].finish_reason in ("stop", "length")


def test_an_agent_turn_reuses_the_previous_prompt_from_the_prefix_cache(client: OpenAI) -> None:
    request: dict[str, Any] = {
        "model": QWEN,
        "messages": messages(user("What is the weather in Paris?")),
        "tools": tools(GET_WEATHER_TOOL),
    }
    first = client.chat.completions.create(**request)
    again = client.chat.completions.create(**request)
    assert calls_of(again) == calls_of(first)
    assert again.usage is not None
    assert again.usage.prompt_tokens_details is not None
    cached = again.usage.prompt_tokens_details.cached_tokens or 0
    # The whole prompt but the last token (whose logits generation needs) comes from the cache.
    assert cached >= again.usage.prompt_tokens - 1


def test_allowed_tools_required_calls_only_an_allowed_tool(server: ExoServer) -> None:
    # Both tools stay in the prompt (so its cached prefix is unchanged); only get_time may be called.
    body: dict[str, Any] = {
        "model": QWEN,
        "messages": [user("What is the weather in Paris?")],
        "tools": [GET_WEATHER_TOOL, GET_TIME_TOOL],
        "tool_choice": {
            "type": "allowed_tools",
            "allowed_tools": {"mode": "required", "tools": [{"type": "function", "function": {"name": "get_time"}}]},
        },
    }
    response = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    message = response.json()["choices"][0]["message"]
    names = [call["function"]["name"] for call in message["tool_calls"]]
    assert names
    assert set(names) == {"get_time"}
    assert response.json()["choices"][0]["finish_reason"] == "tool_calls"


def test_a_strict_tool_whose_schema_cannot_be_enforced_is_a_400_and_the_server_keeps_serving(
    server: ExoServer, client: OpenAI
) -> None:
    def tag_tool(*, strict: bool) -> JsonObject:
        tags: JsonObject = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
        parameters: JsonObject = {"type": "object", "properties": {"tags": tags}, "required": ["tags"]}
        return {"type": "function", "function": {"name": "tag", "strict": strict, "parameters": parameters}}

    def ask(tool: JsonObject, tool_choice: str) -> httpx.Response:
        body: dict[str, Any] = {
            "model": QWEN,
            "messages": [user("Hello!")],
            "tools": [tool],
            "tool_choice": tool_choice,
        }
        return httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120)

    refused = ask(tag_tool(strict=True), "auto")
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "unsupported"
    assert "uniqueItems" in error["message"]
    # Without `strict`, even a forced call is served: the grammar enforces what it can (an array of strings) and
    # leaves uniqueItems to the validation after the call.
    forced = ask(tag_tool(strict=False), "required")
    assert forced.status_code == 200, forced.text
    calls = forced.json()["choices"][0]["message"]["tool_calls"]
    assert calls
    for call in calls:
        tags = json.loads(call["function"]["arguments"])["tags"]
        assert isinstance(tags, list)
        assert all(isinstance(tag, str) for tag in cast(list[object], tags))
    greeting = client.chat.completions.create(model=QWEN, messages=messages(user("Hello!")))
    assert greeting.choices[0].message.content == GREETING_REPLY
