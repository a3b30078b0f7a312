"""Runner faults against a real node: client disconnects, runner crashes mid-request, crash loops.

The tiny fixture model answers its trained prompts in a few tokens and stops on `<|im_end|>` even for untrained
ones (random text ends within ~100 tokens), so a request cannot be made to last. These tests serve a copy of
tiny-qwen-tools with every end-of-sequence id removed: the same weights and the same greedy tokens, but generation
only ends at max_tokens (~700 tokens/s here), so a 4000-token request reliably lasts several seconds.
"""

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from exo.worker.runner.supervisor import restart_delay
from tests.exo_server import ExoServer, running_exo
from tests.fixtures.endless_model import MODEL, endless_copy
from tests.fixtures.fixture_specs import GREETING_REPLY

LONG = 4000
SHORT = 64


@pytest.fixture(scope="module")
def endless_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return endless_copy(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def server(endless_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    with running_exo([endless_model], tmp_path_factory.mktemp("exo")) as running:
        yield running


def chat(content: str, max_tokens: int, **extra: object) -> dict[str, object]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stop": [],
        **extra,
    }


def post(server: ExoServer, body: dict[str, object], timeout: float = 60) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=timeout)


def recent_tasks(server: ExoServer) -> list[dict[str, object]]:
    tasks = server.runner()["recent_tasks"]
    assert isinstance(tasks, list)
    return [task for task in tasks if isinstance(task, dict)]  # pyright: ignore[reportUnknownVariableType]


def wait_for_long_task(server: ExoServer, known: set[object], timeout: float = 30) -> dict[str, object]:
    """The summary of the LONG request's task once the runner reports it ended: a task not in `known` that was
    cancelled or made more tokens than any short request asks for. Matched by id and kind, not by count: the short
    request before it may be reported after its answer (its summary can trail the response on a loaded machine), and
    the runner keeps only its last few summaries."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for task in recent_tasks(server):
            generated = task["generated_tokens"]
            long = isinstance(generated, int) and generated > SHORT
            if task["task_id"] not in known and (task["outcome"] == "cancelled" or long):
                return task
        time.sleep(0.02)
    raise TimeoutError(f"the runner never reported the long task ended: {recent_tasks(server)}")


def runner_metrics(server: ExoServer) -> dict[str, int]:
    metrics = server.runner()["metrics"]
    assert isinstance(metrics, dict)
    return {str(key): value for key, value in metrics.items() if isinstance(value, int)}  # pyright: ignore[reportUnknownVariableType]


def wait_for_metrics(
    server: ExoServer, reached: Callable[[dict[str, int]], bool], timeout: float = 10
) -> dict[str, int]:
    """The runner's counters once `reached` holds for them (they are reported a moment after a task's summary)."""
    deadline = time.monotonic() + timeout
    while not reached(metrics := runner_metrics(server)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the runner's counters never got there: {metrics}")
        time.sleep(0.02)
    return metrics


def running_pid(server: ExoServer, timeout: float = 30) -> int:
    """The runner's pid once /state shows it running a task."""
    runner = server.wait_for_status("running", timeout=timeout)
    pid = runner["pid"]
    assert isinstance(pid, int)
    return pid


def test_client_disconnect_stops_generation_frees_the_runner_and_keeps_the_cache_consistent(
    server: ExoServer, endless_model: Path, tmp_path: Path
) -> None:
    prompt = "Disconnect probe: tell me a very long story."
    with running_exo([endless_model], tmp_path, ["--prefix-cache-gb", "0"]) as uncached:
        reference = post(uncached, chat(prompt, SHORT)).json()
    assert reference["usage"]["completion_tokens"] == SHORT
    assert reference["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    post(server, chat(prompt, SHORT))  # the prompt is now in the prefix cache, as in an agent's next turn
    known = {task["task_id"] for task in recent_tasks(server)}
    counted = runner_metrics(server)

    received: list[str] = []
    with httpx.stream(
        "POST", f"{server.base_url}/v1/chat/completions", json=chat(prompt, LONG, stream=True), timeout=60
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and '"content"' in line:
                received.append(line)
            if len(received) >= 4:
                break  # leaving the block closes the connection mid-stream
    disconnected_at = time.time()

    cancelled = wait_for_long_task(server, known)
    assert cancelled["outcome"] == "cancelled"
    generated = cancelled["generated_tokens"]
    finished_at = cancelled["finished_at"]
    assert isinstance(generated, int)
    assert isinstance(finished_at, float)
    # The runner is not paced by the client: on a loaded machine it may be thousands of tokens ahead of what the
    # client has read when the client leaves. What the disconnect must do is stop it at once: the runner checks for a
    # cancel after every token, so it ends within moments of the API noticing; all 4000 would mean it went unnoticed.
    assert generated < LONG, cancelled
    assert finished_at - disconnected_at < 3, cancelled
    # The runner's counters take the cancelled request's usage so far: its tokens count though no answer finished.
    after = wait_for_metrics(server, lambda metrics: metrics["requests_cancelled"] > counted["requests_cancelled"])
    assert after["generated_tokens"] - counted["generated_tokens"] == generated
    assert after["prompt_tokens"] - counted["prompt_tokens"] == reference["usage"]["prompt_tokens"]

    started = time.monotonic()
    again = post(server, chat(prompt, SHORT)).json()
    assert time.monotonic() - started < 10
    # The cancelled generation's cache was filed under the tokens it really holds: the greedy answer of a server with
    # no cache at all comes back, with all of the prompt but the last token served from the cache.
    assert again["choices"][0]["message"]["content"] == reference["choices"][0]["message"]["content"]
    assert again["usage"]["prompt_tokens"] == reference["usage"]["prompt_tokens"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == again["usage"]["prompt_tokens"] - 1
    assert not server.state()["tasks"]


def test_a_runner_killed_mid_stream_ends_the_stream_with_one_error_then_done_and_restarts(server: ExoServer) -> None:
    before = server.wait_for_status("ready")
    events: list[str] = []
    with httpx.stream(
        "POST",
        f"{server.base_url}/v1/chat/completions",
        json=chat("Kill me while streaming.", LONG, stream=True),
        timeout=60,
    ) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        for line in lines:
            if line.startswith("data: ") and '"content"' in line:
                break  # generation is under way: the next 4000 tokens take seconds
        os.kill(running_pid(server), signal.SIGKILL)
        events = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    errors = [json.loads(event)["error"] for event in events[:-1] if '"error"' in event]
    assert len(errors) == 1
    assert "crashed" in errors[0]["message"]
    assert set(errors[0]) >= {"message", "type", "param", "code"}
    contents = [json.loads(event) for event in events[:-1] if '"error"' not in event]
    assert all(chunk["choices"][0]["finish_reason"] is None for chunk in contents if chunk["choices"])
    assert_recovered(server, before)


def test_a_runner_killed_mid_request_fails_it_with_an_openai_shaped_500_and_restarts(server: ExoServer) -> None:
    before = server.wait_for_status("ready")
    result: dict[str, httpx.Response] = {}
    sender = threading.Thread(target=lambda: result.setdefault("response", post(server, chat("Kill me.", LONG))))
    sender.start()
    os.kill(running_pid(server), signal.SIGKILL)
    sender.join(timeout=60)
    response = result["response"]
    assert response.status_code == 500
    error = response.json()["error"]
    assert "crashed" in error["message"]
    assert set(error) >= {"message", "type", "param", "code"}
    assert_recovered(server, before)


def assert_recovered(server: ExoServer, before: dict[str, object]) -> None:
    """/state shows the crash, the runner is back with a new process, and the next request succeeds."""
    failed = recent_tasks(server)[-1]
    assert failed["outcome"] == "failed"
    assert failed["generated_tokens"] is None
    recovered = server.wait_for_status("ready", timeout=60)
    assert recovered["pid"] != before["pid"]
    assert isinstance(before["restarts"], int)
    assert recovered["restarts"] == before["restarts"] + 1
    assert "exited with code -9 while serving" in str(recovered["last_error"])
    greeting = post(server, chat("Hello!", 64, stop=["<|im_end|>"]))
    assert greeting.status_code == 200
    assert greeting.json()["choices"][0]["message"]["content"] == GREETING_REPLY
    assert not server.state()["tasks"]


def wait_for_new_loading_runner(server: ExoServer, old_pid: object, timeout: float = 30) -> tuple[int, float]:
    """Poll until a replacement runner process is loading; return its pid and when it was first seen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runner = server.runner()
        if runner["pid"] != old_pid and runner["status"] == "loading" and isinstance(runner["pid"], int):
            return runner["pid"], time.monotonic()
        time.sleep(0.01)
    raise TimeoutError(f"no replacement runner appeared: {server.runner()}")


def test_a_runner_that_keeps_crashing_backs_off_then_reports_failed_and_the_api_keeps_serving(
    endless_model: Path, tmp_path: Path
) -> None:
    with running_exo([endless_model], tmp_path) as server:
        pid = server.runner()["pid"]
        assert isinstance(pid, int)
        gaps: list[float] = []
        # One crash while serving, then three while loading: the third failed load makes the supervisor give up.
        for _ in range(4):
            os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            if len(gaps) == 3:
                break
            pid, seen = wait_for_new_loading_runner(server, pid)
            gaps.append(seen - killed)
        failed = server.wait_for_status("failed", timeout=30)
        time.sleep(1.0)  # no further restart is attempted
        final = server.runner()
        assert final["status"] == "failed"
        assert final["pid"] == failed["pid"]
        assert final["restarts"] == 3
        assert "while loading" in str(final["last_error"])
        # Each restart waited at least its backoff: 0.5 s, then 1 s, then 2 s.
        assert all(gap >= wanted for gap, wanted in zip(gaps, (0.5, 1.0, 2.0), strict=True)), gaps
        assert httpx.get(f"{server.base_url}/health").json() == {"status": "ok"}
        refused = post(server, chat("Hello!", 8))
        assert refused.status_code == 503
        error = refused.json()["error"]
        assert error["code"] == "model_unavailable"
        assert "while loading" in error["message"]


def test_restart_delay_doubles_from_half_a_second_up_to_ten() -> None:
    assert [restart_delay(crashes) for crashes in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
