"""`tool_choice` required / named / strict / none through a real node for the Mistral, pythonic, Qwen3-Coder and
GPT-OSS harmony formats: random-weight models with each family's tokenizer and template (tests/fixtures/
format_models.py), so whatever they write is what the grammar forced, parsed by that format's streaming parser,
streamed over real HTTP and checked against the streaming contract."""

import json
from collections.abc import Generator
from typing import Any

import httpx
import jsonschema
import pytest

from exo.conformance.checker import check_stream, sse_payloads
from exo.conformance.contract import StreamSummary
from exo.tool_calls.names import ToolFormatName
from tests.exo_server import ExoServer, running_exo
from tests.fixtures.format_models import FORMAT_MODELS, build_format_model

WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    "required": ["city"],
    "additionalProperties": False,
}
TIME_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
OPENINGS = {
    ToolFormatName.MISTRAL: "[TOOL_CALLS]",
    ToolFormatName.PYTHONIC: "<|tool_call_start|>",
    ToolFormatName.QWEN3_CODER: "<tool_call>",
    ToolFormatName.HARMONY: "to=functions",
}
FORMATS = list(FORMAT_MODELS)


def _tool(name: str, schema: dict[str, Any], *, strict: bool = False) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": schema, "strict": strict}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Generator[ExoServer]:
    root = tmp_path_factory.mktemp("format-models")
    models = [build_format_model(root / f"tiny-{name.value}", name) for name in FORMATS]
    # Four runners load at once on a shared 2-core machine: give them time.
    with running_exo(models, root, ready_timeout=300) as running:
        yield running


def _model(tool_format: ToolFormatName) -> str:
    return f"tiny-{tool_format.value}"


def _stream(server: ExoServer, body: dict[str, Any]) -> StreamSummary:
    """POST a streamed request, check the SSE stream against the contract, return what a client accumulates."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=body, timeout=180) as response:
        assert response.status_code == 200, response.read()
        text = response.read().decode()
    checked = check_stream(sse_payloads(text), include_usage=True)
    assert not checked.violations, checked.violations
    return checked.summary


def _request(tool_format: ToolFormatName, tool_choice: object, tools: list[dict[str, Any]]) -> dict[str, Any]:
    request: dict[str, Any] = {
        "model": _model(tool_format),
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": tools,
        "tool_choice": tool_choice,
        "parallel_tool_calls": False,
        "max_tokens": 200,
        "seed": 7,
    }
    if tool_format is ToolFormatName.HARMONY:
        # The grammar leaves GPT-OSS its analysis message (free text up to `<|end|>`) before the call. Random
        # weights end it only by chance (about one token in 400 under sampling), so give them room and a sampler.
        request.update(temperature=1.0, max_tokens=4000)
    return request


@pytest.mark.parametrize("tool_format", FORMATS)
def test_the_format_is_detected_from_the_family_s_template(server: ExoServer, tool_format: ToolFormatName) -> None:
    metadata = server.runner(_model(tool_format))["metadata"]
    assert isinstance(metadata, dict)
    assert metadata.get("tool_format") == tool_format.value  # pyright: ignore[reportUnknownMemberType]


@pytest.mark.parametrize("tool_format", FORMATS)
def test_required_streams_one_schema_valid_call(server: ExoServer, tool_format: ToolFormatName) -> None:
    tools = [_tool("get_weather", WEATHER_SCHEMA), _tool("get_time", TIME_SCHEMA)]
    summary = _stream(server, _request(tool_format, "required", tools))
    assert summary.finish_reason == "tool_calls"
    assert len(summary.calls) == 1
    schemas = {"get_weather": WEATHER_SCHEMA, "get_time": TIME_SCHEMA}
    jsonschema.validate(json.loads(summary.calls[0].arguments), schemas[summary.calls[0].name])


@pytest.mark.parametrize("tool_format", FORMATS)
def test_a_named_tool_is_the_call_and_finishes_with_tool_calls(server: ExoServer, tool_format: ToolFormatName) -> None:
    tools = [_tool("get_weather", WEATHER_SCHEMA), _tool("get_time", TIME_SCHEMA)]
    named = {"type": "function", "function": {"name": "get_time"}}
    summary = _stream(server, _request(tool_format, named, tools))
    assert [call.name for call in summary.calls] == ["get_time"]
    jsonschema.validate(json.loads(summary.calls[0].arguments), TIME_SCHEMA)
    assert summary.finish_reason == "tool_calls"
    completion = httpx.post(
        f"{server.base_url}/v1/chat/completions", json=_request(tool_format, named, tools), timeout=180
    ).json()
    calls = completion["choices"][0]["message"]["tool_calls"]
    assert [call["function"]["name"] for call in calls] == ["get_time"]


@pytest.mark.parametrize("tool_format", FORMATS)
def test_strict_arguments_validate_every_keyword(server: ExoServer, tool_format: ToolFormatName) -> None:
    strict_schema = {
        **WEATHER_SCHEMA,
        "properties": {**WEATHER_SCHEMA["properties"], "days": {"type": "integer", "maximum": 9}},
    }
    summary = _stream(server, _request(tool_format, "required", [_tool("get_weather", strict_schema, strict=True)]))
    assert [call.name for call in summary.calls] == ["get_weather"]
    jsonschema.validate(json.loads(summary.calls[0].arguments), strict_schema)


@pytest.mark.parametrize("tool_format", FORMATS)
def test_none_answers_without_opening_a_call(server: ExoServer, tool_format: ToolFormatName) -> None:
    request = {**_request(tool_format, "none", [_tool("get_weather", WEATHER_SCHEMA)]), "max_tokens": 40}
    summary = _stream(server, request)
    assert summary.calls == ()
    assert summary.finish_reason in ("stop", "length")
    assert OPENINGS[tool_format] not in summary.content
