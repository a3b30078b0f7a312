"""The node end to end: real `exo` subprocess, real runner subprocess, real MLX forward passes, real HTTP."""

import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from tests.exo_server import ExoServer, fixture_model, running_exo
from tests.fixtures.fixture_specs import GREETING_REPLY


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    with running_exo([fixture_model("tiny-qwen-tools")], tmp_path_factory.mktemp("exo")) as running:
        yield running


@pytest.fixture
def client(server: ExoServer) -> OpenAI:
    return OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def sse_payloads(body: str) -> list[str]:
    return [line.removeprefix("data: ") for line in body.splitlines() if line.startswith("data: ")]


def test_non_streaming_completion_returns_the_fixture_text(client: OpenAI) -> None:
    completion = client.chat.completions.create(
        model="tiny-qwen-tools", messages=[{"role": "user", "content": "Hello!"}]
    )
    choice = completion.choices[0]
    assert choice.message.content == GREETING_REPLY
    assert choice.message.role == "assistant"
    assert choice.finish_reason == "stop"
    assert completion.usage is not None
    assert completion.usage.prompt_tokens > 0
    assert completion.usage.completion_tokens > 0
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens


def test_streaming_is_valid_sse_with_role_once_and_finish_last(server: ExoServer) -> None:
    body = {
        "model": "tiny-qwen-tools",
        "messages": [{"role": "user", "content": "Hello!"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    response = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    payloads = sse_payloads(response.text)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(payload) for payload in payloads[:-1]]
    assert len({(chunk["id"], chunk["created"], chunk["model"]) for chunk in chunks}) == 1
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    choice_chunks = [chunk for chunk in chunks if chunk["choices"]]
    roles = [chunk["choices"][0]["delta"].get("role") for chunk in choice_chunks]
    assert roles[0] == "assistant"
    assert all(role is None for role in roles[1:])
    finishes = [chunk["choices"][0]["finish_reason"] for chunk in choice_chunks]
    assert finishes[-1] == "stop"
    assert all(reason is None for reason in finishes[:-1])
    text = "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in choice_chunks)
    assert text == GREETING_REPLY
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["total_tokens"] > 0
    assert "cached_tokens" in usage_chunk["usage"]["prompt_tokens_details"]
    assert all("usage" not in chunk or chunk["usage"] is None for chunk in chunks[:-1])


def test_openai_sdk_streaming_accumulates_the_same_text(client: OpenAI) -> None:
    stream = client.chat.completions.create(
        model="tiny-qwen-tools", messages=[{"role": "user", "content": "Hello!"}], stream=True
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == GREETING_REPLY


def test_models_health_and_state(server: ExoServer) -> None:
    models = httpx.get(f"{server.base_url}/v1/models").json()
    assert [card["id"] for card in models["data"]] == ["tiny-qwen-tools"]
    assert "tool_use" in models["data"][0]["capabilities"]
    assert models["data"][0]["context_length"] == 4096
    assert models["data"][0]["vocab_size"] == 741
    assert httpx.get(f"{server.base_url}/health").json() == {"status": "ok"}
    state = server.state()
    runner = server.runner()
    assert runner["status"] == "ready"
    assert isinstance(runner["pid"], int)
    assert state["nodes"]


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b'{"model": "tiny-qwen-tools", "messages": "hi"}', 400, "messages"),
        (b'{"model": "tiny-qwen-tools", "messages": []}', 400, "at least one message"),
        (b'{"model": "nope", "messages": [{"role": "user", "content": "hi"}]}', 404, "not served"),
        (
            b'{"model": "tiny-qwen-tools", "max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]}',
            400,
            "max_tokens",
        ),
        (
            b'{"model": "tiny-qwen-tools", "temperature": "hot", "messages": [{"role": "user", "content": "hi"}]}',
            400,
            "temperature",
        ),
    ],
)
def test_bad_requests_get_openai_shaped_errors_and_the_server_keeps_serving(
    server: ExoServer, client: OpenAI, body: bytes, status: int, needle: str
) -> None:
    response = httpx.post(
        f"{server.base_url}/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == status
    error = response.json()["error"]
    assert needle in error["message"]
    assert set(error) >= {"message", "type", "param", "code"}
    completion = client.chat.completions.create(
        model="tiny-qwen-tools", messages=[{"role": "user", "content": "Hello!"}]
    )
    assert completion.choices[0].message.content == GREETING_REPLY


@pytest.mark.parametrize("stream", [False, True])
def test_prompt_longer_than_the_context_is_a_400_that_says_how_long(server: ExoServer, stream: bool) -> None:
    long_text = "weather " * 5000
    body = {"model": "tiny-qwen-tools", "messages": [{"role": "user", "content": long_text}], "stream": stream}
    response = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "4096" in error["message"]


def test_killing_the_idle_runner_restarts_it_and_the_next_request_succeeds(server: ExoServer, client: OpenAI) -> None:
    before = server.runner()
    pid = before["pid"]
    assert isinstance(pid, int)
    os.kill(pid, signal.SIGKILL)
    # Until the supervisor sees the exit, /state still shows the killed runner as ready: wait for its successor.
    restarted = server.wait_for_status("ready", timeout=60, not_pid=pid)
    assert restarted["pid"] != pid
    assert isinstance(restarted["restarts"], int)
    assert isinstance(before["restarts"], int)
    assert restarted["restarts"] == before["restarts"] + 1
    completion = client.chat.completions.create(
        model="tiny-qwen-tools", messages=[{"role": "user", "content": "Hello!"}]
    )
    assert completion.choices[0].message.content == GREETING_REPLY


def test_killing_the_runner_mid_request_fails_that_request_and_recovers(tmp_path: Path) -> None:
    # tiny-qwen-agent has a 32k context and a character-level vocabulary (16 tokens per repeat): the ~29k-token
    # prompt takes seconds to prefill, so the kill lands mid-request.
    with running_exo([fixture_model("tiny-qwen-agent")], tmp_path) as server:
        body = {
            "model": "tiny-qwen-agent",
            "messages": [{"role": "user", "content": "alpha beta gamma delta " * 1800}],
        }
        result: dict[str, httpx.Response] = {}

        def send() -> None:
            result["response"] = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=300)

        sender = threading.Thread(target=send)
        sender.start()
        running = server.wait_for_status("running", timeout=60)
        pid = running["pid"]
        assert isinstance(pid, int)
        os.kill(pid, signal.SIGKILL)
        sender.join(timeout=120)
        response = result["response"]
        assert response.status_code == 500
        assert "crashed" in response.json()["error"]["message"]
        recovered = server.wait_for_status("ready", timeout=60)
        assert recovered["restarts"] == 1
        assert "exited with code" in str(recovered["last_error"])
        greeting = httpx.post(
            f"{server.base_url}/v1/chat/completions",
            json={"model": "tiny-qwen-agent", "messages": [{"role": "user", "content": "Hello!"}]},
            timeout=60,
        )
        assert greeting.status_code == 200
        assert greeting.json()["choices"][0]["message"]["content"] == GREETING_REPLY
