"""Structured outputs through the whole node: real exo subprocess, runner, MLX, grammar, openai SDK.

The fixture model never saw JSON answers in training, so whatever it writes is the grammar's doing: the content
must parse and validate however unlikely the model found it.
"""

import json
from collections.abc import Iterator
from typing import Literal

import httpx
import jsonschema
import pytest
from openai import OpenAI
from pydantic import BaseModel, ConfigDict, Field

from tests.exo_server import ExoServer, fixture_model, running_exo

QWEN = "tiny-qwen-tools"
FORECAST_SCHEMA: dict[str, object] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "temperature": {"type": "integer", "minimum": -50, "maximum": 50},
        "sky": {"type": "string", "enum": ["sunny", "cloudy", "rain"]},
    },
    "required": ["city", "temperature", "sky"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "What is the weather in Paris? Answer in JSON."}]


class Forecast(BaseModel):
    model_config = ConfigDict(extra="forbid")

    city: str = Field(max_length=20)
    temperature: int = Field(ge=-50, le=50)
    sky: Literal["sunny", "cloudy", "rain"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    with running_exo([fixture_model(QWEN)], tmp_path_factory.mktemp("exo-structured")) as running:
        yield running


@pytest.fixture
def client(server: ExoServer) -> OpenAI:
    return server.openai_client()


def test_json_schema_content_validates_and_the_reply_stops_when_the_value_is_complete(client: OpenAI) -> None:
    completion = client.chat.completions.create(
        model=QWEN,
        messages=ASK,  # pyright: ignore[reportArgumentType] -- plain dicts are the SDK's wire shape
        max_tokens=200,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "forecast", "schema": FORECAST_SCHEMA, "strict": True},
        },
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content or ""), FORECAST_SCHEMA)


def test_sdk_parse_with_a_pydantic_model_returns_the_parsed_object(client: OpenAI) -> None:
    completion = client.chat.completions.parse(
        model=QWEN,
        messages=ASK,  # pyright: ignore[reportArgumentType] -- plain dicts are the SDK's wire shape
        max_tokens=200,
        response_format=Forecast,
    )
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Forecast)
    assert parsed == Forecast.model_validate_json(completion.choices[0].message.content or "")


def test_json_object_streams_one_object_and_max_tokens_cuts_it_with_length(server: ExoServer) -> None:
    body = {"model": QWEN, "messages": ASK, "response_format": {"type": "json_object"}, "stream": True}
    streamed = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120)
    assert streamed.status_code == 200, streamed.text
    chunks = [
        json.loads(line.removeprefix("data: "))
        for line in streamed.text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    content = "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks if chunk["choices"])
    assert isinstance(json.loads(content), dict), content
    assert [chunk["choices"][0]["finish_reason"] for chunk in chunks if chunk["choices"]][-1] == "stop"

    cut = httpx.post(
        f"{server.base_url}/v1/chat/completions", json={**body, "stream": False, "max_tokens": 2}, timeout=120
    ).json()
    assert cut["choices"][0]["finish_reason"] == "length"
    assert cut["choices"][0]["message"]["content"].startswith("{")


def test_a_schema_llguidance_cannot_enforce_is_a_400_from_the_runner(server: ExoServer) -> None:
    schema = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}
    body = {
        "model": QWEN,
        "messages": ASK,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}},
    }
    response = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 400, response.text
    assert "uniqueItems" in response.json()["error"]["message"]
