"""Many streaming tool requests on one runner: each gets its own answer, the queue is FIFO and its limit holds.

A real node serves tiny-qwen-tools with `--batch-size 2 --queue-limit 6`: two tasks decode together in the runner
and up to six wait. To control arrival order and make the queue fill deterministically, some tests freeze the
runner process (SIGSTOP) while requests queue up, then let it go (SIGCONT).
"""

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from tests.exo_server import ExoServer, fixture_model, running_exo
from tests.fixtures.fixture_specs import (
    GET_WEATHER_TOOL,
    GREETING_REPLY,
    PARIS_WEATHER_ANSWER,
    PARIS_WEATHER_RESULT,
    JsonObject,
    assistant_tool_call,
    tool_result,
    user,
)

QUEUE_LIMIT = 6
BATCH_SIZE = 2
MODEL = "tiny-qwen-tools"


@dataclass(frozen=True)
class Expected:
    """A conversation and the answer the fixture model gives it: content, or calls as (name, arguments)."""

    messages: tuple[JsonObject, ...]
    content: str | None
    calls: tuple[tuple[str, JsonObject], ...] = ()


GREETING = Expected((user("Hello!"),), GREETING_REPLY)
PARIS = Expected((user("What is the weather in Paris?"),), None, (("get_weather", {"city": "Paris"}),))
PARIS_AND_TOKYO = Expected(
    (user("What is the weather in Paris and Tokyo?"),),
    None,
    (("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Tokyo"})),
)
AFTER_RESULT = Expected(
    (
        user("What is the weather in Paris?"),
        assistant_tool_call("get_weather", {"city": "Paris"}),
        tool_result(PARIS_WEATHER_RESULT),
    ),
    PARIS_WEATHER_ANSWER,
)
MIX = (PARIS, GREETING, PARIS_AND_TOKYO, AFTER_RESULT, PARIS_AND_TOKYO, PARIS, GREETING, AFTER_RESULT)


@dataclass
class StreamResult:
    status: int = 0
    content: str = ""
    calls: dict[int, dict[str, str]] = field(default_factory=dict[int, dict[str, str]])
    finish_reason: str | None = None
    errors: list[str] = field(default_factory=list[str])
    done: bool = False
    body: str = ""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    arguments = ["--queue-limit", str(QUEUE_LIMIT), "--batch-size", str(BATCH_SIZE)]
    with running_exo([fixture_model(MODEL)], tmp_path_factory.mktemp("exo"), arguments) as running:
        yield running


def stream_chat(server: ExoServer, expected: Expected, result: StreamResult) -> None:
    """POST a streaming request offering the weather tool and fold its SSE events into `result`."""
    body = {"model": MODEL, "messages": list(expected.messages), "tools": [GET_WEATHER_TOOL], "stream": True}
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=body, timeout=120) as response:
        result.status = response.status_code
        if response.status_code != 200:
            result.body = response.read().decode()
            return
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            payload = line.removeprefix("data: ")
            if payload == "[DONE]":
                result.done = True
                continue
            event = json.loads(payload)
            if "error" in event:
                result.errors.append(event["error"]["message"])
                continue
            for choice in event["choices"]:
                delta = choice["delta"]
                result.content += delta.get("content") or ""
                for call in delta.get("tool_calls") or []:
                    slot = result.calls.setdefault(call["index"], {"id": "", "name": "", "arguments": ""})
                    slot["id"] += call.get("id") or ""
                    function = call.get("function") or {}
                    slot["name"] += function.get("name") or ""
                    slot["arguments"] += function.get("arguments") or ""
                result.finish_reason = choice["finish_reason"] or result.finish_reason


def assert_answers(result: StreamResult, expected: Expected) -> None:
    assert result.status == 200, result.body
    assert result.done
    assert result.errors == []
    if expected.calls:
        calls = [result.calls[index] for index in sorted(result.calls)]
        assert [(call["name"], json.loads(call["arguments"])) for call in calls] == list(expected.calls)
        assert len({call["id"] for call in calls}) == len(calls)
        assert result.finish_reason == "tool_calls"
        assert result.content == ""
    else:
        assert result.calls == {}
        assert result.content == expected.content
        assert result.finish_reason == "stop"


def start(server: ExoServer, expected: Expected) -> tuple[threading.Thread, StreamResult]:
    result = StreamResult()
    thread = threading.Thread(target=stream_chat, args=(server, expected, result))
    thread.start()
    return thread, result


class AbandonedRequest:
    """A non-streaming request sent over a bare socket, so the test (not a client timeout racing a loaded machine)
    decides when its client hangs up."""

    def __init__(self, server: ExoServer) -> None:
        body = json.dumps({"model": MODEL, "messages": [user("Hello!")]}).encode()
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        self._socket = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        self._socket.sendall(head.encode() + body)

    def hang_up(self) -> None:
        self._socket.shutdown(socket.SHUT_RDWR)
        self._socket.close()


def task_ids(server: ExoServer) -> set[str]:
    tasks = server.state()["tasks"]
    assert isinstance(tasks, dict)
    return {str(task_id) for task_id in tasks}  # pyright: ignore[reportUnknownVariableType]


def wait_for_new_task(server: ExoServer, known: set[str], timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = task_ids(server) - known
        if new:
            assert len(new) == 1
            return new.pop()
        time.sleep(0.01)
    raise TimeoutError("the request never became a task")


def runner_pid(server: ExoServer) -> int:
    pid = server.wait_for_status("ready")["pid"]
    assert isinstance(pid, int)
    return pid


def task_statuses(server: ExoServer) -> dict[str, str]:
    tasks = server.state()["tasks"]
    assert isinstance(tasks, dict)
    return {str(task_id): str(task["status"]) for task_id, task in tasks.items()}  # pyright: ignore[reportUnknownVariableType]


def test_eight_concurrent_streaming_tool_requests_each_get_their_own_answer(server: ExoServer) -> None:
    barrier = threading.Barrier(len(MIX))
    results = [StreamResult() for _ in MIX]

    def send(expected: Expected, result: StreamResult) -> None:
        barrier.wait()
        stream_chat(server, expected, result)

    threads = [threading.Thread(target=send, args=pair) for pair in zip(MIX, results, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    for result, expected in zip(results, MIX, strict=True):
        assert_answers(result, expected)
    assert task_ids(server) == set()
    assert server.runner()["status"] == "ready"


def test_queued_requests_run_first_in_first_out_and_past_the_limit_get_429(server: ExoServer) -> None:
    pid = runner_pid(server)
    known = task_ids(server)
    submitted: list[str] = []
    running: list[tuple[threading.Thread, StreamResult]] = []
    os.kill(pid, signal.SIGSTOP)
    try:
        # BATCH_SIZE requests run (they are handed to the frozen runner) and QUEUE_LIMIT wait: all are accepted.
        for expected in MIX:
            running.append(start(server, expected))
            submitted.append(wait_for_new_task(server, known))
            known.add(submitted[-1])
        statuses = task_statuses(server)
        assert [statuses[task_id] for task_id in submitted] == ["running"] * BATCH_SIZE + ["queued"] * QUEUE_LIMIT
        # Past the limit: refused at once with an OpenAI-shaped 429, streaming or not.
        refused = StreamResult()
        stream_chat(server, GREETING, refused)
        body = {"model": MODEL, "messages": [user("Hello!")]}
        plain = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=30)
        assert plain.headers["retry-after"] == "2"  # the OpenAI SDKs wait this long before retrying
        for status, payload in ((refused.status, json.loads(refused.body)), (plain.status_code, plain.json())):
            assert status == 429
            assert payload["error"]["code"] == "queue_full"
            assert payload["error"]["type"] == "rate_limit_error"
            assert set(payload["error"]) >= {"message", "type", "param", "code"}
    finally:
        os.kill(pid, signal.SIGCONT)
    # First in, first out: in every snapshot while the batch drains the queue, the tasks still waiting are the
    # latest arrivals (a later task never starts before an earlier one), and at most BATCH_SIZE run at once.
    snapshots = 0
    while any(thread.is_alive() for thread, _ in running):
        statuses = task_statuses(server)
        waiting = [statuses.get(task_id) == "queued" for task_id in submitted]
        assert waiting == sorted(waiting), waiting
        assert list(statuses.values()).count("running") <= BATCH_SIZE
        snapshots += 1
        time.sleep(0.01)
    assert snapshots > 0
    for thread, _ in running:
        thread.join(timeout=120)
    for (_, result), expected in zip(running, MIX, strict=True):
        assert_answers(result, expected)
    assert task_ids(server) == set()


def test_a_queued_request_whose_client_leaves_is_dropped_and_the_rest_still_complete(server: ExoServer) -> None:
    pid = runner_pid(server)
    known = task_ids(server)
    os.kill(pid, signal.SIGSTOP)
    try:
        first: list[tuple[threading.Thread, StreamResult]] = []
        first_ids: set[str] = set()
        for expected in (PARIS, GREETING):  # they fill the batch
            first.append(start(server, expected))
            first_ids.add(wait_for_new_task(server, known))
            known |= first_ids
        # A non-streaming request whose client gives up while it waits in the queue.
        abandoned = AbandonedRequest(server)
        abandoned_id = wait_for_new_task(server, known)
        known.add(abandoned_id)
        last = start(server, PARIS_AND_TOKYO)
        last_id = wait_for_new_task(server, known)
        assert task_statuses(server)[abandoned_id] == "queued"
        abandoned.hang_up()
        deadline = time.monotonic() + 10
        while abandoned_id in task_ids(server) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert task_ids(server) == {*first_ids, last_id}
    finally:
        os.kill(pid, signal.SIGCONT)
    for (thread, result), expected in zip([*first, last], (PARIS, GREETING, PARIS_AND_TOKYO), strict=True):
        thread.join(timeout=120)
        assert_answers(result, expected)
    recent = server.runner()["recent_tasks"]
    assert isinstance(recent, list)
    outcomes = {str(task["task_id"]): task["outcome"] for task in recent if isinstance(task, dict)}  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    assert outcomes[abandoned_id] == "cancelled"
    assert {outcomes[task_id] for task_id in {*first_ids, last_id}} == {"finished"}
