"""Bad input gets a clear OpenAI-shaped 4xx, never reaches a runner, and leaves the server serving.

Every case runs in process against the production app (fast, and it proves nothing was handed to the master), and
the whole table is replayed once against a real `exo` subprocess with the tiny fixture model, which must still
answer the fixture greeting afterwards.
"""

import builtins
import io
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from fastapi.testclient import TestClient

from exo.node import NodeConfig
from tests.api.inprocess_app import SCRIPTED_MODEL, SCRIPTED_REPLY, ResponseLike, ScriptedMaster, scripted_app
from tests.exo_server import ExoServer, fixture_model, running_exo
from tests.fixtures.fixture_specs import GET_WEATHER_TOOL, GREETING_REPLY

JsonBody = dict[str, object]
# Small enough that a test can exceed it cheaply; the real server runs with the same limit.
MAX_REQUEST_MB = 0.0625
MAX_REQUEST_BYTES = int(MAX_REQUEST_MB * 1024 * 1024)
HELLO: list[JsonBody] = [{"role": "user", "content": "Hello!"}]
CALL: JsonBody = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
}


def tool(name: str, parameters: JsonBody | None = None, tool_type: str = "function") -> JsonBody:
    function: JsonBody = {"name": name, "parameters": parameters or {"type": "object", "properties": {}}}
    return {"type": tool_type, "function": function}


@dataclass(frozen=True)
class BadRequest:
    """A request that must be refused with `status`, a message containing `needle` and (when set) `param`."""

    name: str
    # JSON fields merged over a valid request ("model" filled in unless given), or raw bytes sent as is.
    body: JsonBody | bytes
    status: int
    needle: str
    param: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def content(self, model: str) -> bytes:
        if isinstance(self.body, bytes):
            return self.body
        return json.dumps({"model": model, "messages": HELLO, **self.body}).encode()


# Schemas nothing can finish (each was a 500, or an empty "JSON" answer): one that applies itself to the same value
# without end, and one no finite value satisfies (every `next` needs a `next`).
SELF_REFERENCE: JsonBody = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
NEXT_REQUIRED: JsonBody = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "next": {"$ref": "#"}},
    "required": ["city", "next"],
}


def strict_tool(name: str, parameters: JsonBody) -> JsonBody:
    return {"type": "function", "function": {"name": name, "parameters": parameters, "strict": True}}


def answer_format(schema: JsonBody) -> JsonBody:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


CASES = [
    BadRequest("malformed_json", b'{"model": "x", "messages": [', 400, "not valid JSON"),
    BadRequest("body_not_an_object", b"[1, 2, 3]", 400, "must be a JSON object"),
    BadRequest("empty_body", b"", 400, "the request body is empty"),
    BadRequest(
        "json_sent_as_a_form",
        b'{"model": "scripted-model", "messages": [{"role": "user", "content": "Hello!"}]}',
        400,
        "Content-Type: application/json",
        headers={"content-type": "application/x-www-form-urlencoded"},
    ),
    BadRequest("messages_missing", b'{"model": "scripted-model"}', 400, "messages: Field required", param="messages"),
    BadRequest("messages_null", {"messages": None}, 400, "messages", param="messages"),
    BadRequest("messages_wrong_type", {"messages": "Hello!"}, 400, "messages", param="messages"),
    BadRequest("message_not_an_object", {"messages": ["Hello!"]}, 400, "messages[0]", param="messages[0]"),
    BadRequest("unknown_role", {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "role", "messages[0].role"),
    BadRequest("content_wrong_type", {"messages": [{"role": "user", "content": 42}]}, 400, "content"),
    BadRequest("temperature_wrong_type", {"temperature": "hot"}, 400, "temperature", param="temperature"),
    BadRequest("temperature_out_of_range", {"temperature": 3.5}, 400, "less than or equal to 2", "temperature"),
    BadRequest("top_p_zero", {"top_p": 0}, 400, "greater than 0", param="top_p"),
    BadRequest("max_tokens_as_string", {"max_tokens": "5"}, 400, "valid integer", param="max_tokens"),
    BadRequest("stream_as_string", {"stream": "yes"}, 400, "valid boolean", param="stream"),
    BadRequest("stop_wrong_type", {"stop": 5}, 400, "stop", param="stop"),
    BadRequest("tools_wrong_type", {"tools": "get_weather"}, 400, "tools", param="tools"),
    BadRequest(
        "unknown_top_level_field",
        {"max_token": 10},
        400,
        "Unrecognized request argument supplied: max_token",
        "max_token",
    ),
    BadRequest(
        "several_unknown_fields",
        {"functions": [], "guided_json": {}},
        400,
        "Unrecognized request arguments supplied: functions, guided_json",
        param="functions",
    ),
    BadRequest("empty_messages", {"messages": []}, 400, "at least one message", param="messages"),
    BadRequest(
        "tool_message_without_tool_call_id",
        {"messages": [*HELLO, {"role": "tool", "content": "sunny"}]},
        400,
        "needs a tool_call_id",
        param="messages[1]",
    ),
    BadRequest(
        "tool_message_with_unmatched_tool_call_id",
        {
            "messages": [
                *HELLO,
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_2", "content": "sunny"},
            ]
        },
        400,
        "does not match any earlier assistant tool call",
        param="messages[2].tool_call_id",
    ),
    BadRequest("tool_not_type_function", {"tools": [tool("search", tool_type="retrieval")]}, 400, "must be 'function'"),
    BadRequest("duplicate_tool_names", {"tools": [tool("get_weather"), tool("get_weather")]}, 400, "duplicate tool"),
    BadRequest(
        "tool_name_with_spaces", {"tools": [tool("get weather")]}, 400, "must be 1-64 ASCII", "tools[0].function.name"
    ),
    BadRequest("tool_name_not_ascii", {"tools": [tool("météo")]}, 400, "must be 1-64 ASCII", "tools[0].function.name"),
    BadRequest("tool_name_too_long", {"tools": [tool("f" * 65)]}, 400, "must be 1-64 ASCII", "tools[0].function.name"),
    # Booleans are booleans at every depth, as documented ("yes" was taken as true inside nested objects).
    BadRequest(
        "include_usage_as_string",
        {"stream_options": {"include_usage": "yes"}},
        400,
        "valid boolean",
        param="stream_options.include_usage",
    ),
    BadRequest(
        "tool_strict_as_string",
        {"tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]},
        400,
        "valid boolean",
        param="tools[0].function.strict",
    ),
    BadRequest(
        "response_format_strict_as_number",
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "strict": 1}}},
        400,
        "valid boolean",
        param="response_format.json_schema.strict",
    ),
    BadRequest(
        "response_format_name_not_a_string",
        {"response_format": {"type": "json_schema", "json_schema": {"name": 5, "schema": {}}}},
        400,
        "valid string",
        param="response_format.json_schema.name",
    ),
    BadRequest(
        "named_tool_choice_name_not_a_string",
        {"tools": [GET_WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": 5}}},
        400,
        "valid string",
        param="tool_choice.function.name",
    ),
    BadRequest(
        "parameters_not_a_json_schema",
        {"tools": [tool("get_weather", {"type": "object", "properties": {"city": {"type": "strng"}}})]},
        400,
        "not a valid JSON Schema",
        param="tools[0].function.parameters",
    ),
    BadRequest(
        "parameters_not_an_object",
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
        400,
        "tools[0].function.parameters",
        param="tools[0].function.parameters",
    ),
    BadRequest(
        "tool_choice_names_a_missing_tool",
        {"tools": [GET_WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
        400,
        "'get_time', which is not in tools",
        param="tool_choice",
    ),
    BadRequest(
        "tool_choice_required_without_tools", {"tool_choice": "required"}, 400, "non-empty tools", "tool_choice"
    ),
    BadRequest(
        "tool_choice_unknown_mode", {"tools": [GET_WEATHER_TOOL], "tool_choice": "sometimes"}, 400, "tool_choice"
    ),
    BadRequest(
        "self_referencing_tool_schema_under_required",
        {"tools": [tool("get_weather", SELF_REFERENCE)], "tool_choice": "required"},
        400,
        "applies itself to the same value without end",
        param="tools[0].function.parameters",
    ),
    BadRequest(
        "self_referencing_tool_schema_under_auto",
        {"tools": [tool("get_weather", SELF_REFERENCE)]},
        400,
        "applies itself to the same value without end",
        param="tools[0].function.parameters",
    ),
    BadRequest(
        "self_referencing_response_format",
        {"response_format": answer_format(SELF_REFERENCE)},
        400,
        "applies itself to the same value without end",
        param="response_format.json_schema.schema",
    ),
    BadRequest(
        "endlessly_required_tool_schema_under_required",
        {"tools": [tool("get_weather", NEXT_REQUIRED)], "tool_choice": "required"},
        400,
        "no finite value satisfies it (required 'next' → $ref '#')",
        param="tools[0].function.parameters",
    ),
    BadRequest(
        "endlessly_required_tool_schema_named",
        {
            "tools": [GET_WEATHER_TOOL, tool("get_time", NEXT_REQUIRED)],
            "tool_choice": {"type": "function", "function": {"name": "get_time"}},
        },
        400,
        "no finite value satisfies it",
        param="tools[1].function.parameters",
    ),
    BadRequest(
        "endlessly_required_strict_tool_schema",
        {"tools": [strict_tool("get_weather", NEXT_REQUIRED)]},
        400,
        "no finite value satisfies it",
        param="tools[0].function.parameters",
    ),
    BadRequest(
        "endlessly_required_response_format",
        {"response_format": answer_format(NEXT_REQUIRED)},
        400,
        "no finite value satisfies it",
        param="response_format.json_schema.schema",
    ),
    BadRequest("max_tokens_zero", {"max_tokens": 0}, 400, "greater than or equal to 1", param="max_tokens"),
    BadRequest("max_tokens_negative", {"max_tokens": -5}, 400, "greater than or equal to 1", param="max_tokens"),
    BadRequest(
        "max_completion_tokens_zero",
        {"max_completion_tokens": 0},
        400,
        "greater than or equal to 1",
        param="max_completion_tokens",
    ),
    BadRequest("n_greater_than_one", {"n": 2}, 400, "only n=1", param="n"),
    # Sampling values mlx cannot take (each was a 500): the seed is an unsigned 64-bit integer, top_k must be below
    # the vocabulary (tiny-qwen-tools and the scripted model: 741 tokens).
    BadRequest("seed_negative", {"seed": -1}, 400, "must be between 0 and 18446744073709551615", param="seed"),
    BadRequest("seed_2_to_the_64", {"seed": 2**64}, 400, "must be between 0 and", param="seed"),
    BadRequest("seed_2_to_the_70", {"seed": 2**70}, 400, "must be between 0 and", param="seed"),
    BadRequest(
        "top_k_at_the_vocabulary_size", {"top_k": 741, "temperature": 0.7}, 400, "vocabulary size of 741", "top_k"
    ),
    BadRequest("top_k_huge", {"top_k": 2**70}, 400, "vocabulary size of 741", param="top_k"),
    BadRequest("top_k_below_minus_one", {"top_k": -2}, 400, "greater than or equal to -1", param="top_k"),
    BadRequest("too_many_stop_sequences", {"stop": ["a"] * 17}, 400, "at most 16 items", param="stop"),
    BadRequest("stop_sequence_too_long", {"stop": ["ok", "x" * 1001]}, 400, "at most 1000 characters", "stop[1]"),
    BadRequest(
        "image_content_part",
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]},
        400,
        "'image_url' are not supported",
        param="messages[0].content",
    ),
    BadRequest(
        "text_part_without_text",
        {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
        400,
        "needs a 'text' string",
        param="messages[0].content[0].text",
    ),
    BadRequest(
        "response_format_invalid_json_schema",
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}},
        400,
        "response_format.json_schema.schema is not a valid JSON Schema",
        param="response_format.json_schema.schema",
    ),
    BadRequest("logprobs_requested", {"logprobs": True}, 400, "logprobs are not supported", param="logprobs"),
    BadRequest("logit_bias_requested", {"logit_bias": {"42": 100}}, 400, "logit_bias is not supported", "logit_bias"),
    BadRequest("model_path_traversal", {"model": "../../etc"}, 404, "not served", param="model"),
    BadRequest("model_deep_path_traversal", {"model": "../../../../etc/passwd"}, 404, "not served", param="model"),
    BadRequest("model_absolute_path", {"model": "/etc/passwd"}, 404, "not served", param="model"),
    BadRequest("model_windows_traversal", {"model": "..\\..\\windows\\system32"}, 404, "not served", param="model"),
    BadRequest("model_missing", {"model": "no-such-model"}, 404, "not served", param="model"),
    BadRequest("body_over_the_size_limit", {"padding_field": "x" * MAX_REQUEST_BYTES}, 413, "larger than"),
    # Text that cannot be passed on (lone surrogates, NUL, bytes that are not UTF-8) and numbers JSON does not have,
    # in any field: refused by the request guard before any route, naming where.
    BadRequest(
        "lone_surrogate_in_content",
        {"messages": [{"role": "user", "content": "\ud800"}]},
        400,
        "lone UTF-16 surrogate",
        param="messages[0].content",
    ),
    BadRequest(
        "lone_surrogate_in_a_content_part",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "ok \udfff"}]}]},
        400,
        "lone UTF-16 surrogate",
        param="messages[0].content[0].text",
    ),
    BadRequest(
        "lone_surrogate_in_a_tool_description",
        {"tools": [{"type": "function", "function": {"name": "f", "description": "\ud800"}}]},
        400,
        "lone UTF-16 surrogate",
        param="tools[0].function.description",
    ),
    BadRequest("lone_surrogate_in_a_stop_string", {"stop": ["\ud800"]}, 400, "lone UTF-16 surrogate", "stop[0]"),
    BadRequest("lone_surrogate_in_the_model_id", {"model": "\ud800"}, 400, "lone UTF-16 surrogate", param="model"),
    BadRequest(
        "lone_surrogate_in_tool_call_arguments",
        {
            "messages": [
                *HELLO,
                {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": {"\ud800": 1}}}]},
            ]
        },
        400,
        "a key of messages[1].tool_calls[0].function.arguments",
        param="messages[1].tool_calls[0].function.arguments",
    ),
    BadRequest(
        "nul_in_content", {"messages": [{"role": "user", "content": "a\x00b"}]}, 400, "NUL", "messages[0].content"
    ),
    BadRequest("nul_in_a_tool_name", {"tools": [tool("get\x00weather")]}, 400, "NUL", "tools[0].function.name"),
    BadRequest("invalid_utf8_bytes", b'{"messages": [{"role": "user", "content": "caf\xe9"}]}', 400, "not valid UTF-8"),
    BadRequest(
        "nan_temperature",
        b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
        400,
        "NaN is not a JSON number",
        "temperature",
    ),
    BadRequest(
        "infinity_in_a_schema",
        b'{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f", '
        b'"parameters": {"type": "object", "maxProperties": Infinity}}}]}',
        400,
        "Infinity is not a JSON number",
        param="tools[0].function.parameters.maxProperties",
    ),
]


def assert_openai_error(response: ResponseLike, case: BadRequest) -> None:
    assert response.status_code == case.status, response.text
    payload = response.json()
    assert set(payload) == {"error"}
    error = payload["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str)
    assert case.needle in error["message"]
    assert error["type"] == ("not_found_error" if case.status == 404 else "invalid_request_error")
    if case.param is not None:
        assert error["param"] == case.param


@pytest.fixture
def app() -> Iterator[tuple[TestClient, ScriptedMaster]]:
    application, master = scripted_app(NodeConfig(max_request_bytes=MAX_REQUEST_BYTES))
    with TestClient(application) as client:
        yield client, master


def post(client: TestClient | httpx.Client, content: bytes, headers: dict[str, str] | None = None) -> ResponseLike:
    return client.post(
        "/v1/chat/completions", content=content, headers={"content-type": "application/json", **(headers or {})}
    )


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_bad_request_is_refused_before_any_runner_and_the_app_keeps_serving(
    app: tuple[TestClient, ScriptedMaster], case: BadRequest
) -> None:
    client, master = app
    assert_openai_error(post(client, case.content(SCRIPTED_MODEL), case.headers), case)
    assert master.tasks == []
    good = post(client, json.dumps({"model": SCRIPTED_MODEL, "messages": HELLO}).encode())
    assert good.status_code == 200
    assert good.json()["choices"][0]["message"]["content"] == SCRIPTED_REPLY
    assert len(master.tasks) == 1


def chunked(total: int, piece: int = 4096) -> Iterator[bytes]:
    sent = 0
    while sent < total:
        yield b" " * min(piece, total - sent)
        sent += piece


def test_a_chunked_body_over_the_limit_is_413_without_content_length(app: tuple[TestClient, ScriptedMaster]) -> None:
    client, master = app
    response = client.post("/v1/chat/completions", content=chunked(MAX_REQUEST_BYTES * 2))
    assert "content-length" not in response.request.headers
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "body_too_large"
    assert master.tasks == []


def test_a_chunked_body_under_the_limit_is_served(app: tuple[TestClient, ScriptedMaster]) -> None:
    client, _ = app
    body = json.dumps({"model": SCRIPTED_MODEL, "messages": HELLO}).encode()
    response = client.post(
        "/v1/chat/completions", content=iter([body[:10], body[10:]]), headers={"content-type": "application/json"}
    )
    assert "content-length" not in response.request.headers
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == SCRIPTED_REPLY


def test_model_ids_with_paths_never_touch_the_filesystem(
    app: tuple[TestClient, ScriptedMaster], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, _ = app
    touched: list[str] = []
    real_stat, real_open = os.stat, builtins.open

    def recording_stat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        touched.append(str(path))
        return real_stat(path, *args, **kwargs)  # pyright: ignore[reportArgumentType, reportCallIssue]

    def recording_open(path: object, *args: object, **kwargs: object) -> object:
        touched.append(str(path))
        return real_open(path, *args, **kwargs)  # pyright: ignore[reportArgumentType, reportCallIssue]

    monkeypatch.setattr(os, "stat", recording_stat)
    monkeypatch.setattr(builtins, "open", recording_open)
    monkeypatch.setattr(io, "open", recording_open)
    for model in ("../../etc", "/etc/passwd", "~/.ssh/id_rsa", "./tiny-qwen-tools"):
        response = post(client, json.dumps({"model": model, "messages": HELLO}).encode())
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "model_not_found"
    assert not [path for path in touched if "etc" in path or "ssh" in path or "tiny-qwen" in path]


AI_SDK_REQUEST: JsonBody = {
    # A superset of what opencode 1.x sends through @ai-sdk/openai-compatible (bodies captured from the real CLI):
    # its standard settings, the SDK's extras (reasoning_effort, verbosity, user), per-model `options` from
    # opencode.json spread at the top level (top_k, min_p, chat_template_kwargs…), and cache_control on a part.
    "max_tokens": 32000,
    "temperature": 0.55,
    "top_p": 1,
    "frequency_penalty": 0,
    "presence_penalty": 0,
    "seed": 7,
    "user": "opencode",
    "reasoning_effort": "high",
    "verbosity": "low",
    "prompt_cache_key": "ses_123",
    "top_k": 20,
    "min_p": 0.0,
    "repetition_penalty": 1.05,
    "chat_template_kwargs": {"enable_thinking": False},
    "metadata": {"session": "ses_123"},
    "store": False,
    "service_tier": "auto",
    "safety_identifier": "user-1",
    "parallel_tool_calls": True,
    "response_format": {"type": "text"},
    "logprobs": False,
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Hello!", "cache_control": {"type": "ephemeral"}}]}
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Get the current weather for a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
                "strict": False,
            },
        }
    ],
    "tool_choice": "auto",
    "stream": False,
}


def test_allow_listed_extension_fields_from_opencode_are_accepted(app: tuple[TestClient, ScriptedMaster]) -> None:
    client, master = app
    response = post(client, json.dumps({"model": SCRIPTED_MODEL, **AI_SDK_REQUEST}).encode())
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == SCRIPTED_REPLY
    (task,) = master.tasks
    assert task.params.sampling.temperature == 0.55
    assert task.params.sampling.seed == 7
    assert [message.content for message in task.params.messages] == ["Hello!"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    with running_exo(
        [fixture_model("tiny-qwen-tools")],
        tmp_path_factory.mktemp("exo"),
        extra_args=["--max-request-mb", str(MAX_REQUEST_MB)],
    ) as running:
        yield running


CONTEXT_TOO_LONG = BadRequest(
    "prompt_longer_than_the_context",
    {"messages": [{"role": "user", "content": "weather " * 5000}]},
    400,
    "context is 4096 tokens",
)


def assert_greeted(client: httpx.Client) -> None:
    good = post(client, json.dumps({"model": "tiny-qwen-tools", "messages": HELLO}).encode())
    assert good.status_code == 200, good.text
    assert good.json()["choices"][0]["message"]["content"] == GREETING_REPLY


def test_a_real_server_refuses_every_bad_request_and_still_answers(server: ExoServer) -> None:
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        for case in [*CASES, CONTEXT_TOO_LONG]:
            assert_openai_error(post(client, case.content("tiny-qwen-tools"), case.headers), case)
            assert_greeted(client)
        too_long_stream = post(client, CONTEXT_TOO_LONG.content("tiny-qwen-tools")[:-1] + b', "stream": true}')
        assert_openai_error(too_long_stream, CONTEXT_TOO_LONG)
        chunked_response = client.post("/v1/chat/completions", content=chunked(MAX_REQUEST_BYTES * 2))
        assert chunked_response.status_code == 413
        assert server.process.poll() is None
        assert server.runner()["restarts"] == 0
        for body in ({"messages": HELLO}, AI_SDK_REQUEST):
            good = post(client, json.dumps({"model": "tiny-qwen-tools", **body}).encode())
            assert good.status_code == 200, good.text
            assert good.json()["choices"][0]["message"]["content"] == GREETING_REPLY


def test_a_real_server_streams_an_opencode_shaped_request(server: ExoServer) -> None:
    body = {"model": "tiny-qwen-tools", **AI_SDK_REQUEST, "stream": True, "stream_options": {"include_usage": True}}
    response = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    payloads = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(payload) for payload in payloads[:-1]]
    text = "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks if chunk["choices"])
    assert text == GREETING_REPLY


def test_escaped_unicode_that_is_valid_reaches_the_runner_intact(app: tuple[TestClient, ScriptedMaster]) -> None:
    client, master = app
    text = "emoji \U0001f600, caf\u00e9, \u4e2d\u6587, NaN and Infinity as words"
    response = post(
        client, json.dumps({"model": SCRIPTED_MODEL, "messages": [{"role": "user", "content": text}]}).encode()
    )
    assert response.status_code == 200, response.text
    assert master.tasks[0].params.messages[0].content == text


def test_an_endlessly_required_schema_stays_lenient_under_plain_auto(app: tuple[TestClient, ScriptedMaster]) -> None:
    """Under plain "auto" no grammar enforces the schema (the parser checks arguments after the fact, and checking a
    finite value always ends), so the request is served as documented; only a named tool is forced."""
    client, master = app
    tools = [GET_WEATHER_TOOL, tool("get_time", NEXT_REQUIRED)]
    for choice in ("auto", {"type": "function", "function": {"name": "get_weather"}}):
        body = {"model": SCRIPTED_MODEL, "messages": HELLO, "tools": tools, "tool_choice": choice}
        response = post(client, json.dumps(body).encode())
        assert response.status_code == 200, response.text
    assert len(master.tasks) == 2


def test_a_json_syntax_error_names_no_field_and_says_where_it_is(app: tuple[TestClient, ScriptedMaster]) -> None:
    client, _ = app
    response = post(client, b'{"model": "scripted-model", "messages": [')
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] is None  # it used to be the character offset, as if that were a field
    assert "not valid JSON" in error["message"]
    assert "(at character 41)" in error["message"]
