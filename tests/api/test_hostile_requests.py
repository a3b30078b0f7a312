"""Property: no request body, however hostile, gets a 5xx from a real node or stops it from serving the next one.

Bodies are generated from each endpoint's own request model (hostile_bodies.py): every field, nested, with lone
surrogates, NUL, huge and negative numbers, NaN, wrong types and schemas without end, mixed with bodies that are
sound enough to reach the model. They go to a real node serving tiny-qwen-tools over HTTP; after every batch a
normal request must still get the model's usual answer.
"""

import json
import time
from collections.abc import Iterator
from typing import cast

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from exo.api.types.anthropic_messages import CountTokensRequest, MessagesRequest
from exo.api.types.ollama import OllamaChatRequest, OllamaGenerateRequest
from exo.api.types.openai_chat import ChatCompletionRequest
from exo.api.types.openai_responses import InputTokensRequest, ResponsesRequest
from tests.api.hostile_bodies import hostile_bodies
from tests.exo_server import ExoServer, fixture_model, running_exo
from tests.fixtures.fixture_specs import GREETING_REPLY

MODEL = "tiny-qwen-tools"
EXAMPLES = 40
BATCH = 10
# What a failure on the server's side looks like inside a 200 stream, in each protocol's error shape.
SERVER_FAILURES = ('"server_error"', '"api_error"', '"internal_error"', "internal server error")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    with running_exo([fixture_model(MODEL)], tmp_path_factory.mktemp("exo-hostile")) as server:
        yield server


def assert_still_serving(client: httpx.Client) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello!"}], "temperature": 0}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == GREETING_REPLY


def send(client: httpx.Client, path: str, body: dict[str, object]) -> httpx.Response:
    # ensure_ascii writes a lone surrogate as the JSON escape "\ud800", as an attacker's client would.
    content = json.dumps(body, ensure_ascii=True, allow_nan=True).encode()
    return client.post(path, content=content, headers={"Content-Type": "application/json"})


@pytest.mark.parametrize(
    ("path", "model"),
    [
        ("/v1/chat/completions", ChatCompletionRequest),
        ("/v1/messages", MessagesRequest),
        ("/v1/responses", ResponsesRequest),
        ("/v1/messages/count_tokens", CountTokensRequest),
        ("/v1/responses/input_tokens", InputTokensRequest),
        ("/api/chat", OllamaChatRequest),
        ("/api/generate", OllamaGenerateRequest),
    ],
)
def test_hostile_bodies_never_get_a_5xx_and_the_node_keeps_serving(
    node: ExoServer, path: str, model: type[BaseModel]
) -> None:
    bodies = st.one_of(
        hostile_bodies(model, MODEL, 0, lean=True),
        hostile_bodies(model, MODEL, 8, lean=True),
        hostile_bodies(model, MODEL, 25),
        hostile_bodies(model, MODEL, 6),
    )
    with httpx.Client(base_url=node.base_url, timeout=120) as client:
        sent: list[int] = []

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
        )
        @given(body=bodies)
        def refused_or_served(body: dict[str, object]) -> None:
            response = send(client, path, body)
            shown = json.dumps(body, ensure_ascii=True, allow_nan=True)[:2000]
            assert response.status_code < 500, f"{path} {shown} -> {response.status_code} {response.text}"
            if response.status_code == 200 and body.get("stream") is True:
                assert not any(failure in response.text for failure in SERVER_FAILURES), (shown, response.text)
            sent.append(response.status_code)
            if len(sent) % BATCH == 0:
                assert_still_serving(client)

        refused_or_served()
        assert_still_serving(client)
    # The mix reached both sides: refusals and bodies the node served.
    assert 200 in sent, sent
    assert any(400 <= status < 500 for status in sent), sent


# Named cases from adversarial runs, each on the same real node: every dialect's schema fields nested past the limit
# (a 500 on main 0b66627), one at the limit enforced by the grammar through to a validated call, and a body of
# 100,000 messages (503 no_master after 9 s under load).
def _nested_objects(levels: int) -> dict[str, object]:
    schema: dict[str, object] = {"enum": [1]}  # a leaf of one token: the model cannot ramble inside the call
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"], "additionalProperties": False}
    return schema


TOO_DEEP = _nested_objects(100)  # 200 levels of JSON: still parsed, far past the 64 allowed
DEEP_SCHEMA_BODIES: dict[str, tuple[str, dict[str, object]]] = {
    "chat tool": (
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": TOO_DEEP}}],
        },
    ),
    "chat response_format": (
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": TOO_DEEP}},
        },
    ),
    "messages tool": (
        "/v1/messages",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "tools": [{"name": "f", "input_schema": TOO_DEEP}],
        },
    ),
    "count_tokens tool": (
        "/v1/messages/count_tokens",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "f", "input_schema": TOO_DEEP}],
        },
    ),
    "responses tool": (
        "/v1/responses",
        {
            "model": MODEL,
            "input": "hi",
            "max_output_tokens": 4,
            "tools": [{"type": "function", "name": "f", "parameters": TOO_DEEP}],
        },
    ),
    "responses text.format": (
        "/v1/responses",
        {
            "model": MODEL,
            "input": "hi",
            "max_output_tokens": 4,
            "text": {"format": {"type": "json_schema", "name": "r", "schema": TOO_DEEP}},
        },
    ),
    "ollama chat format": (
        "/api/chat",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "format": TOO_DEEP, "stream": False},
    ),
    "ollama chat tool": (
        "/api/chat",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "stream": False,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": TOO_DEEP}}],
        },
    ),
}


@pytest.mark.parametrize("case", list(DEEP_SCHEMA_BODIES))
def test_a_schema_nested_past_the_limit_is_a_400_naming_it_on_a_real_node(node: ExoServer, case: str) -> None:
    path, body = DEEP_SCHEMA_BODIES[case]
    with httpx.Client(base_url=node.base_url, timeout=120) as client:
        response = send(client, path, body)
        assert response.status_code == 400, response.text
        assert "64 levels" in response.text
        assert_still_serving(client)


def test_a_schema_at_the_limit_is_enforced_by_the_grammar_through_to_a_validated_call(node: ExoServer) -> None:
    at_limit = _nested_objects(31)  # 63 levels of JSON: the deepest call the grammar must make the model write
    tool = {"type": "function", "function": {"name": "f", "parameters": at_limit}}
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "call f"}],
        "tools": [tool],
        "tool_choice": "required",
        "max_tokens": 600,
        "temperature": 0,
    }
    with httpx.Client(base_url=node.base_url, timeout=300) as client:
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        (call,) = response.json()["choices"][0]["message"]["tool_calls"]
        arguments: object = json.loads(call["function"]["arguments"])
        for _ in range(31):
            assert isinstance(arguments, dict)
            arguments = cast(dict[str, object], arguments)["a"]
        assert arguments == 1
        assert_still_serving(client)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/chat", "/v1/messages", "/v1/responses"])
def test_a_100k_message_body_is_refused_within_a_second_by_a_real_node(node: ExoServer, path: str) -> None:
    messages = [{"role": "user" if index % 2 == 0 else "assistant", "content": "hi"} for index in range(100_000)]
    body: dict[str, object] = (
        {"model": MODEL, "input": messages} if path == "/v1/responses" else {"model": MODEL, "messages": messages}
    )
    with httpx.Client(base_url=node.base_url, timeout=120) as client:
        started = time.monotonic()
        response = send(client, path, {**body, "max_tokens": 4} if path == "/v1/messages" else body)
        elapsed = time.monotonic() - started
        assert response.status_code == 400, response.text
        assert "at most 10000" in response.text
        assert elapsed < 1.0, f"refused after {elapsed:.2f} s"
        assert_still_serving(client)
