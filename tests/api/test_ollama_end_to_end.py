"""Ollama's API through the whole node: real exo subprocess, runner, MLX, tool parser, the official `ollama` client.

The fixture model answers fixed prompts with fixed greedy outputs (tests/fixtures/fixture_specs.py); the same
prompts sent in Ollama's dialect must give the answers chat completions gives, tool calls as Ollama's objects.
"""

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest
from ollama import ChatResponse, Client, Message, ResponseError

from exo.api.ollama.models import human_number
from tests.exo_server import ExoServer, fixture_model, running_exo
from tests.fixtures.fixture_specs import GET_WEATHER_TOOL, GREETING_REPLY, PARIS_WEATHER_ANSWER, PARIS_WEATHER_RESULT

QWEN = "tiny-qwen-tools"
FORECAST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "temperature": {"type": "integer", "minimum": -50, "maximum": 50},
    },
    "required": ["city", "temperature"],
    "additionalProperties": False,
}
API_KEY = "ollama-test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    with running_exo([fixture_model(QWEN)], tmp_path_factory.mktemp("exo-ollama"), api_key=API_KEY) as running:
        yield running


@pytest.fixture
def client(server: ExoServer) -> Client:
    return Client(host=server.base_url, timeout=120, headers=AUTH)


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def streamed(client: Client, messages: list[dict[str, Any]], **extra: Any) -> list[ChatResponse]:
    return list(client.chat(model=QWEN, messages=messages, stream=True, **extra))


def test_chat_answers_with_the_fixture_greeting_streamed_and_not(client: Client) -> None:
    whole = client.chat(model=QWEN, messages=user("Hello!"))
    assert whole.message.role == "assistant"
    assert whole.message.content == GREETING_REPLY
    assert whole.done
    assert whole.done_reason == "stop"
    assert (whole.prompt_eval_count or 0) > 0
    assert (whole.eval_count or 0) > 0
    assert (whole.total_duration or 0) >= (whole.eval_duration or 0) > 0

    parts = streamed(client, user("Hello!"))
    assert len([part for part in parts if part.message.content]) > 1  # streamed as it was written
    assert "".join(part.message.content or "" for part in parts) == GREETING_REPLY
    assert [part.done for part in parts] == [False] * (len(parts) - 1) + [True]
    assert parts[-1].done_reason == "stop"
    assert parts[-1].eval_count == whole.eval_count


def test_a_tool_call_arrives_whole_and_its_result_leads_to_the_answer(client: Client) -> None:
    ask = user("What is the weather in Paris?")
    whole = client.chat(model=QWEN, messages=ask, tools=[GET_WEATHER_TOOL])
    calls = whole.message.tool_calls or []
    assert [(call.function.name, dict(call.function.arguments)) for call in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert whole.message.content == ""

    parts = streamed(client, ask, tools=[GET_WEATHER_TOOL])
    streamed_calls = [call for part in parts for call in part.message.tool_calls or []]
    # Ollama streams a call whole: one line holds its name and its arguments as an object, never fragments.
    assert [(call.function.name, dict(call.function.arguments)) for call in streamed_calls] == [
        ("get_weather", {"city": "Paris"})
    ]

    history: list[dict[str, Any] | Message] = [
        *ask,
        whole.message,
        {"role": "tool", "content": PARIS_WEATHER_RESULT, "tool_name": "get_weather"},
    ]
    answer = client.chat(model=QWEN, messages=history, tools=[GET_WEATHER_TOOL])
    assert answer.message.content == PARIS_WEATHER_ANSWER
    assert not answer.message.tool_calls


def test_parallel_calls_are_separate_whole_calls(server: ExoServer) -> None:
    # Raw HTTP: the `ollama` client re-orders a tool's schema keys ("required" before "properties"), which renders
    # a prompt the tiny fixture model was not trained on for this case.
    body = {"model": QWEN, "messages": user("What is the weather in Paris and Tokyo?"), "tools": [GET_WEATHER_TOOL]}
    response = httpx.post(f"{server.base_url}/api/chat", json=body, headers=AUTH, timeout=120)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in response.text.splitlines()]
    calls = [call for line in lines for call in line["message"].get("tool_calls", [])]
    assert [call["function"]["arguments"] for call in calls] == [{"city": "Paris"}, {"city": "Tokyo"}]
    assert [call["function"]["index"] for call in calls] == [0, 1]
    assert len({call["id"] for call in calls}) == 2
    assert lines[-1]["done"] is True
    assert lines[-1]["done_reason"] == "stop"


def test_exo_tool_choice_extension_forces_a_call(server: ExoServer) -> None:
    # Ollama has no tool_choice (its clients never send one); exo's extension enforces it where a client does.
    body = {
        "model": QWEN,
        "messages": user("Hello!"),
        "tools": [GET_WEATHER_TOOL],
        "tool_choice": "required",
        "stream": False,
    }
    response = httpx.post(f"{server.base_url}/api/chat", json=body, headers=AUTH, timeout=120)
    assert response.status_code == 200, response.text
    calls = response.json()["message"]["tool_calls"]
    assert calls
    assert all(call["function"]["name"] == "get_weather" for call in calls)
    for call in calls:
        jsonschema.validate(call["function"]["arguments"], GET_WEATHER_TOOL["function"]["parameters"])  # pyright: ignore[reportArgumentType, reportIndexIssue, reportCallIssue, reportOptionalSubscript]


def test_format_with_a_schema_makes_the_reply_valid_json(client: Client) -> None:
    ask = user("What is the weather in Paris? Answer in JSON.")
    whole = client.chat(model=QWEN, messages=ask, format=FORECAST_SCHEMA)
    jsonschema.validate(json.loads(whole.message.content or ""), FORECAST_SCHEMA)
    json_object = client.generate(model=QWEN, prompt="Hello!", format="json", options={"num_predict": 200})
    assert isinstance(json.loads(json_object.response or ""), dict)


def test_generate_answers_the_prompt_streamed_and_not(client: Client) -> None:
    whole = client.generate(model=QWEN, prompt="Hello!", options={"temperature": 0, "seed": 7})
    assert whole.response == GREETING_REPLY
    assert whole.done
    assert whole.done_reason == "stop"
    parts = list(client.generate(model=QWEN, prompt="Hello!", stream=True))
    assert "".join(part.response or "" for part in parts) == GREETING_REPLY
    assert parts[-1].done
    cut = client.generate(model=QWEN, prompt="Hello!", options={"num_predict": 2})
    assert cut.done_reason == "length"
    assert cut.eval_count == 2


def test_tags_show_ps_and_version_describe_the_served_model(client: Client, server: ExoServer) -> None:
    assert [model.model for model in client.list().models] == [QWEN]
    assert [model.model for model in client.ps().models] == [QWEN]
    shown = client.show(QWEN)
    assert "tools" in (shown.capabilities or [])
    context = [value for key, value in (shown.modelinfo or {}).items() if key.endswith(".context_length")]
    assert context
    assert context[0] > 0
    assert client.show(f"{QWEN}:latest").capabilities == shown.capabilities
    version = httpx.get(f"{server.base_url}/api/version", headers=AUTH)
    assert version.status_code == 200
    assert version.json()["version"].count(".") == 2


def test_failures_are_ollama_errors_with_their_status(client: Client, server: ExoServer) -> None:
    with pytest.raises(ResponseError) as unknown:
        client.chat(model="no-such-model", messages=user("Hello!"))
    assert unknown.value.status_code == 404
    assert "no-such-model" in unknown.value.error
    with pytest.raises(ResponseError) as image:
        client.chat(model=QWEN, messages=[{"role": "user", "content": "What is this?", "images": [b"\x89PNG"]}])
    assert image.value.status_code == 400
    assert "image" in image.value.error
    with pytest.raises(ResponseError) as too_wide:
        client.chat(model=QWEN, messages=user("Hello!"), options={"num_ctx": 10**9})
    assert too_wide.value.status_code == 400
    assert "num_ctx" in too_wide.value.error
    with pytest.raises(ResponseError) as sampler:
        client.generate(model=QWEN, prompt="Hello!", options={"mirostat": 2})
    assert sampler.value.status_code == 400
    assert "mirostat" in sampler.value.error
    with pytest.raises(ResponseError) as embeddings:
        client.embed(model=QWEN, input="Hello!")
    assert embeddings.value.status_code == 404
    unauthorized = httpx.post(f"{server.base_url}/api/chat", json={"model": QWEN, "messages": user("Hello!")})
    assert unauthorized.status_code == 401
    assert set(unauthorized.json()) == {"error"}
    # A stream's own status holds for a refusal found before any line went out.
    refused = httpx.post(
        f"{server.base_url}/api/chat",
        json={"model": QWEN, "messages": user("Hello!"), "options": {"temperature": "hot"}},
        headers=AUTH,
    )
    assert refused.status_code == 400
    assert set(refused.json()) == {"error"}


def test_a_body_labelled_as_a_form_as_curl_sends_it_is_read_as_json(server: ExoServer) -> None:
    # `curl URL -d '{...}'`, as Ollama's own docs show it, labels the body application/x-www-form-urlencoded.
    body = json.dumps({"model": QWEN, "messages": user("Hello!"), "stream": False})
    headers = {"Content-Type": "application/x-www-form-urlencoded", **AUTH}
    response = httpx.post(f"{server.base_url}/api/chat", content=body, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["message"]["content"] == GREETING_REPLY


def test_tags_and_show_describe_the_checkpoint_as_ollama_does(client: Client) -> None:
    """Family is the architecture (not the tool-call format), with the parameter size, the storage and the files'
    bytes: read here from the fixture's own config and safetensors headers."""
    files = fixture_model(QWEN)
    config = json.loads((files / "config.json").read_text())
    weights = sum(path.stat().st_size for path in files.glob("model*.safetensors"))
    (listed,) = client.list().models
    assert listed.details is not None
    assert listed.details.family == config["model_type"] == "qwen2"
    assert listed.details.families == ["qwen2"]
    assert listed.details.quantization_level == "F32"
    # 121,728 parameters (tiny): Ollama writes counts below a million as thousands.
    assert listed.details.parameter_size == "122K"
    # The files' bytes, less their headers.
    assert listed.size is not None
    assert 0.9 * weights < listed.size <= weights
    shown = client.show(QWEN)
    assert shown.details is not None
    assert shown.details.family == "qwen2"
    assert shown.details.parameter_size == listed.details.parameter_size
    assert (shown.modelinfo or {})["general.architecture"] == "qwen2"
    assert (shown.modelinfo or {})["general.parameter_count"] == 121_728
    assert "qwen2.context_length" in (shown.modelinfo or {})


def test_parameter_sizes_are_written_as_ollama_writes_them() -> None:
    assert [
        human_number(count) for count in (494_032_768, 7_615_616_512, 7_000_000_000, 500_000_000, 121_728, 999)
    ] == [
        "494.03M",
        "7.6B",
        "7B",
        "500M",
        "122K",
        "999",
    ]
