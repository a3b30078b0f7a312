"""Repair of failed calls through the whole node (real exo subprocess, runner, MLX forward passes, SSE, openai SDK).

The fixture model is trained to botch three calls when only `get_weather` is offered: it calls `get_time` (not
offered), writes `{"city": }` (not JSON) and asks for "Paris" where an enum lacks it. With the lazy "auto" grammar off,
a repair takes each failed call back to where it started and re-decodes it under the grammar, so the client gets a
call that validates; with repair off too, the failure rule's answers come back as before.
"""

import json
from collections.abc import Iterator
from typing import Any, cast

import httpx
import jsonschema
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletion, ChatCompletionMessageFunctionToolCall

from tests.exo_server import ExoServer, fixture_model, running_exo
from tests.fixtures.fixture_specs import GET_WEATHER_TOOL, JsonObject, user

QWEN = "tiny-qwen-tools"
ENUM_WEATHER_TOOL: JsonObject = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Rome", "Oslo"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
# `not` is a keyword llguidance skips: the grammar holds this tool only in part, and the trained "Paris" breaks it.
# Otherwise the trained tool, so the model still writes its trained call.
NOT_PARIS_TOOL: JsonObject = {
    "type": "function",
    "function": {
        **cast(dict[str, Any], GET_WEATHER_TOOL["function"]),
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name", "not": {"const": "Paris"}}},
            "required": ["city"],
        },
    },
}
UNHELD: dict[str, Any] = {"auto_tool_grammar": False}
NO_REPAIR: dict[str, Any] = {"auto_tool_grammar": False, "tool_call_repair": False}
BOTCHED = [
    ("What time is it in Tokyo?", GET_WEATHER_TOOL),  # calls get_time, which is not offered
    ("Break the tool.", GET_WEATHER_TOOL),  # writes `{"city": }`
    ("What is the weather in Paris?", ENUM_WEATHER_TOOL),  # writes "Paris", which the enum lacks
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    with running_exo([fixture_model(QWEN)], tmp_path_factory.mktemp("exo-repair")) as running:
        yield running


@pytest.fixture
def client(server: ExoServer) -> OpenAI:
    return server.openai_client()


def _request(question: str, tool: JsonObject, extra: dict[str, Any]) -> dict[str, Any]:
    return {"model": QWEN, "messages": [user(question)], "tools": [tool], "extra_body": extra}


def _calls(completion: ChatCompletion) -> list[ChatCompletionMessageFunctionToolCall]:
    calls = completion.choices[0].message.tool_calls or []
    return [call for call in calls if isinstance(call, ChatCompletionMessageFunctionToolCall)]


def _streamed(client: OpenAI, request: dict[str, Any]) -> ChatCompletion:
    with client.chat.completions.stream(**request) as stream:
        for _ in stream:
            pass
        return stream.get_final_completion()


def _sse(server: ExoServer, request: dict[str, Any]) -> list[dict[str, Any]]:
    body = {key: value for key, value in request.items() if key != "extra_body"} | request["extra_body"]
    response = httpx.post(f"{server.base_url}/v1/chat/completions", json={**body, "stream": True}, timeout=120)
    assert response.status_code == 200, response.text
    payloads = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
    assert payloads[-1] == "[DONE]"
    return [json.loads(payload) for payload in payloads[:-1]]


@pytest.mark.parametrize(("question", "tool"), BOTCHED)
def test_a_call_no_grammar_held_is_repaired_into_one_that_validates(
    client: OpenAI, server: ExoServer, question: str, tool: JsonObject
) -> None:
    schema = cast(dict[str, Any], tool["function"])["parameters"]
    request = _request(question, tool, UNHELD)
    for completion in (client.chat.completions.create(**request), _streamed(client, request)):
        calls = _calls(completion)
        assert [call.function.name for call in calls] == ["get_weather"]
        jsonschema.validate(json.loads(calls[0].function.arguments), schema)
        assert "<tool_call>" not in (completion.choices[0].message.content or "")
        assert completion.choices[0].finish_reason == "tool_calls"
    assert "a failed tool call is re-decoded under the grammar" in server.log()


def test_a_repaired_call_streams_in_the_usual_shape(server: ExoServer) -> None:
    # The failed attempt never reaches the client: one call, first delta with id, name and "", then fragments.
    chunks = _sse(server, _request("Break the tool.", GET_WEATHER_TOOL, UNHELD))
    deltas = [call for chunk in chunks for choice in chunk["choices"] for call in choice["delta"].get("tool_calls", [])]
    assert deltas[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert deltas[0]["id"].startswith("call_")
    assert all(delta["index"] == 0 and set(delta) == {"index", "function"} for delta in deltas[1:])
    arguments = "".join(delta["function"]["arguments"] for delta in deltas)
    assert isinstance(json.loads(arguments), dict)
    contents = [chunk["choices"][0]["delta"].get("content") for chunk in chunks if chunk["choices"]]
    assert not any(contents)
    assert [chunk["choices"][0]["finish_reason"] for chunk in chunks if chunk["choices"]][-1] == "tool_calls"


def test_repair_off_keeps_the_failure_rule(client: OpenAI) -> None:
    unknown = client.chat.completions.create(**_request("What time is it in Tokyo?", GET_WEATHER_TOOL, NO_REPAIR))
    assert not unknown.choices[0].message.tool_calls
    assert (unknown.choices[0].message.content or "").startswith("<tool_call>")
    broken = client.chat.completions.create(**_request("Break the tool.", GET_WEATHER_TOOL, NO_REPAIR))
    assert [call.function.arguments[:10] for call in _calls(broken)] == ['{"city": }']


def test_a_keyword_the_grammar_skips_is_repaired_by_excluding_the_failed_arguments(
    client: OpenAI, server: ExoServer
) -> None:
    # The lazy grammar is on and holds the call, except for `not`: the trained "Paris" fails, and the repair
    # re-decodes the call with exactly those arguments excluded.
    schema = cast(dict[str, Any], NOT_PARIS_TOOL["function"])["parameters"]
    completion = client.chat.completions.create(**_request("What is the weather in Paris?", NOT_PARIS_TOOL, {}))
    calls = _calls(completion)
    assert [call.function.name for call in calls] == ["get_weather"]
    jsonschema.validate(json.loads(calls[0].function.arguments), schema)
    unrepaired = client.chat.completions.create(
        **_request("What is the weather in Paris?", NOT_PARIS_TOOL, {"tool_call_repair": False})
    )
    assert [json.loads(call.function.arguments) for call in _calls(unrepaired)] == [{"city": "Paris"}]
    assert "a failed tool call is re-decoded under the grammar" in server.log()
