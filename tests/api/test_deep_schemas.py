"""A JSON Schema nested deeper than MAX_SCHEMA_DEPTH levels gets a 400 naming the limit, in the dialect's own error
shape, wherever a schema enters (a tool's parameters, a reply format) and on the token counters too; one at the
limit is served, whatever keyword it nests through.

On main 0b66627 a valid schema nested about 95 levels deep was a 500 everywhere (RecursionError in check_schema).
"""

from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from exo.api.adapters.schema_depth import MAX_SCHEMA_DEPTH, schema_depth_at_least
from tests.api.inprocess_app import SCRIPTED_MODEL, scripted_app

Schema = dict[str, Any]
HI = [{"role": "user", "content": "hi"}]


def nested(depth: int, wrap: Callable[[Schema], Schema]) -> Schema:
    """A valid schema of exactly `depth` levels of JSON objects and arrays, built by `wrap`ping a string schema."""
    schema: Schema = {"type": "string"}
    while schema_depth_at_least(schema, depth) < depth:
        schema = wrap(schema)
    assert schema_depth_at_least(schema, depth) == depth, "the wrapping overshot: pick another depth"
    return schema


# Each adds one or two levels; a depth they cannot reach exactly is made up by a final `items`.
SHAPES: dict[str, Callable[[Schema], Schema]] = {
    "items": lambda inner: {"type": "array", "items": inner},
    "properties": lambda inner: {"type": "object", "properties": {"a": inner}, "required": ["a"]},
    "anyOf": lambda inner: {"anyOf": [inner, {"type": "null"}]},
    "not": lambda inner: {"not": inner},
    "additionalProperties": lambda inner: {"type": "object", "additionalProperties": inner},
}


def shaped(depth: int, shape: str) -> Schema:
    wrap = SHAPES[shape]
    schema: Schema = {"type": "string"}
    while schema_depth_at_least(wrap(schema), depth) <= depth:
        schema = wrap(schema)
    while schema_depth_at_least(schema, depth) < depth:
        schema = SHAPES["items"](schema)
    return schema


def _tool_body(path: str, schema: Schema) -> dict[str, Any]:
    """A body for `path` whose one tool takes `schema` as its parameters (in the dialect's own fields)."""
    if path.startswith("/v1/messages"):
        limit = {} if path.endswith("count_tokens") else {"max_tokens": 8}
        return {"model": SCRIPTED_MODEL, **limit, "messages": HI, "tools": [{"name": "f", "input_schema": schema}]}
    if path.startswith("/v1/responses"):
        return {
            "model": SCRIPTED_MODEL,
            "input": "hi",
            "tools": [{"type": "function", "name": "f", "parameters": schema}],
        }
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    return {"model": SCRIPTED_MODEL, "messages": HI, "tools": [tool], "stream": False}


def _format_body(path: str, schema: Schema) -> dict[str, Any]:
    """A body for `path` asking for a reply that follows `schema`."""
    if path == "/v1/chat/completions":
        json_schema = {"name": "reply", "schema": schema}
        return {
            "model": SCRIPTED_MODEL,
            "messages": HI,
            "response_format": {"type": "json_schema", "json_schema": json_schema},
        }
    if path == "/v1/responses":
        text = {"format": {"type": "json_schema", "name": "reply", "schema": schema}}
        return {"model": SCRIPTED_MODEL, "input": "hi", "text": text}
    if path == "/v1/messages":
        output = {"format": {"type": "json_schema", "schema": schema}}
        return {"model": SCRIPTED_MODEL, "max_tokens": 8, "messages": HI, "output_config": output}
    if path == "/api/generate":
        return {"model": SCRIPTED_MODEL, "prompt": "hi", "format": schema, "stream": False}
    return {"model": SCRIPTED_MODEL, "messages": HI, "format": schema, "stream": False}


# (route, body builder, the field the error names)
CASES: dict[str, tuple[str, Callable[[str, Schema], dict[str, Any]], str]] = {
    "chat tool": ("/v1/chat/completions", _tool_body, "tools[0].function.parameters"),
    "chat response_format": ("/v1/chat/completions", _format_body, "response_format.json_schema.schema"),
    "messages tool": ("/v1/messages", _tool_body, "tools[0].input_schema"),
    "messages output_config": ("/v1/messages", _format_body, "output_config.format.schema"),
    "count_tokens tool": ("/v1/messages/count_tokens", _tool_body, "tools[0].input_schema"),
    "responses tool": ("/v1/responses", _tool_body, "tools[0].parameters"),
    "responses text.format": ("/v1/responses", _format_body, "text.format.schema"),
    "input_tokens tool": ("/v1/responses/input_tokens", _tool_body, "tools[0].parameters"),
    "ollama chat tool": ("/api/chat", _tool_body, "tools[0].function.parameters"),
    "ollama chat format": ("/api/chat", _format_body, "format"),
    "ollama generate format": ("/api/generate", _format_body, "format"),
}


@pytest.fixture(scope="module")
def client() -> TestClient:
    application, _ = scripted_app()
    return TestClient(application, raise_server_exceptions=False)


def _error_message(path: str, body: dict[str, Any]) -> str:
    if path.startswith("/v1/messages"):
        assert body["type"] == "error"
        assert body["error"]["type"] == "invalid_request_error"
        return str(body["error"]["message"])
    if path.startswith("/api/"):
        assert set(body) == {"error"}
        return str(body["error"])
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["code"] == "schema_too_deep"
    return str(body["error"]["message"])


@pytest.mark.parametrize("depth", [MAX_SCHEMA_DEPTH + 1, 95, 190])
@pytest.mark.parametrize("case", list(CASES))
def test_a_schema_nested_past_the_limit_is_a_400_naming_it(client: TestClient, case: str, depth: int) -> None:
    path, build, field = CASES[case]
    response = client.post(path, json=build(path, nested(depth, SHAPES["items"])))

    assert response.status_code == 400, response.text
    message = _error_message(path, response.json())
    assert field in message, message
    assert f"{MAX_SCHEMA_DEPTH} levels" in message, message


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("case", list(CASES))
def test_a_schema_at_the_limit_is_served_whatever_it_nests_through(client: TestClient, case: str, shape: str) -> None:
    path, build, _ = CASES[case]
    schema = shaped(MAX_SCHEMA_DEPTH, shape)
    assert schema_depth_at_least(schema, MAX_SCHEMA_DEPTH) == MAX_SCHEMA_DEPTH

    response = client.post(path, json=build(path, schema))

    assert response.status_code == 200, response.text
