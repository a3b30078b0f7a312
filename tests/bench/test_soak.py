"""`bench.soak`: its contract checks catch broken replies, and a short run on a fixture model passes end to end."""

import asyncio
import json
import random
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from bench.soak import SoakReport
from bench.soak_requests import MIX, Outcome, SoakKind, Target, send

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
FIXTURE = REPOSITORY_ROOT / "tests" / "fixtures" / "models" / "tiny-qwen-tools"
TARGET = Target(model="m", context_length=4096)


def _sse(*lines: str) -> bytes:
    return "".join(f"{line}\n\n" for line in lines).encode()


def _chunk(delta: dict[str, object], finish_reason: str | None = None) -> str:
    return "data: " + json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]})


def _call_delta(arguments: str) -> dict[str, object]:
    return {"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}


def _sent(kind: SoakKind, reply: httpx.Response, seed: int = 0) -> Outcome:
    async def run() -> Outcome:
        transport = httpx.MockTransport(lambda _: reply)
        async with httpx.AsyncClient(transport=transport, base_url="http://node") as client:
            return await send(kind, client, TARGET, random.Random(seed))

    return asyncio.run(run())


def _stream(body: bytes) -> httpx.Response:
    return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})


@pytest.mark.parametrize(
    ("body", "broken"),
    [
        (_sse(_chunk({"content": "hi"}), _chunk({}, "stop"), "data: [DONE]"), False),
        (_sse(_chunk({"content": "hi"}), _chunk({}, "stop")), True),  # no [DONE]
        (_sse(_chunk(_call_delta('{"city"')), _chunk({}, "tool_calls"), "data: [DONE]"), True),
        (_sse(_chunk(_call_delta('{"city"')), _chunk({}, "length"), "data: [DONE]"), False),  # cut by max_tokens
        (_sse(_chunk(_call_delta('{"city": "Paris"}')), _chunk({}, "stop"), "data: [DONE]"), True),  # wrong reason
        (_sse('data: {"error": {"message": "boom"}}', "data: [DONE]"), True),
    ],
)
def test_a_chat_stream_is_judged_by_the_wire_contract(body: bytes, broken: bool) -> None:
    # Seeds whose tool_choice is not "required", so a stream without a call may pass.
    seed = next(seed for seed in range(20) if random.Random(seed).choice(["auto", "required", "none"]) != "required")
    outcome = _sent("chat_stream", _stream(body), seed)
    assert (outcome.anomaly is not None) == broken, outcome.anomaly


def test_a_required_tool_choice_answered_without_a_call_is_an_anomaly() -> None:
    message = {"role": "assistant", "content": "It is sunny."}
    reply = httpx.Response(200, json={"choices": [{"message": message, "finish_reason": "stop"}]})
    outcome = _sent("chat_required", reply)
    assert outcome.anomaly is not None
    assert "no tool call" in outcome.anomaly


@pytest.mark.parametrize(
    ("reply", "broken"),
    [
        (httpx.Response(400, json={"error": {"message": "bad body", "type": "invalid_request_error"}}), False),
        (httpx.Response(500, json={"error": {"message": "internal"}}), True),
        (httpx.Response(200, json={"choices": []}), True),
        (httpx.Response(422, json={"detail": [{"msg": "field required"}]}), True),  # not an OpenAI error object
    ],
)
def test_bad_input_must_get_a_4xx_with_an_error_object(reply: httpx.Response, broken: bool) -> None:
    assert (_sent("bad_input", reply).anomaly is not None) == broken


@pytest.mark.parametrize(
    ("kind", "body", "broken"),
    [
        ("messages_stream", _sse("event: message_start", "data: {}", "event: message_stop", "data: {}"), False),
        ("messages_stream", _sse("event: message_start", "data: {}"), True),
        ("responses_stream", _sse("event: response.incomplete", "data: {}"), False),
        ("responses_stream", _sse("event: response.failed", "data: {}"), True),
    ],
)
def test_each_dialects_stream_must_end_with_its_terminal_event(kind: SoakKind, body: bytes, broken: bool) -> None:
    assert (_sent(kind, _stream(body)).anomaly is not None) == broken


def test_an_ollama_stream_must_end_done() -> None:
    done = httpx.Response(200, content=b'{"message": {}, "done": false}\n{"done": true}\n')
    cut = httpx.Response(200, content=b'{"message": {}, "done": false}\n')
    assert _sent("ollama_chat", done).anomaly is None
    assert _sent("ollama_chat", cut).anomaly is not None


def _usage(prompt: int, cached: int) -> str:
    usage = {"prompt_tokens": prompt, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": cached}}
    return "data: " + json.dumps({"choices": [], "usage": usage})


def _weather_call(call_id: str = "call_1", name: str = "get_weather") -> dict[str, object]:
    function = {"name": name, "arguments": '{"city": "Paris"}'}
    return {"tool_calls": [{"index": 0, "id": call_id, "type": "function", "function": function}]}


def _session(first_turn: bytes) -> tuple[Outcome, list[dict[str, object]]]:
    """An agent session against a node whose first turn answers `first_turn`, each later one a short text with
    usage; the outcome and the bodies the session sent."""
    bodies: list[dict[str, object]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        if len(bodies) == 1:
            return _stream(first_turn)
        later = _sse(_chunk({"content": "Done."}), _chunk({}, "stop"), _usage(100 * len(bodies), 80), "data: [DONE]")
        return _stream(later)

    async def run() -> Outcome:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer), base_url="http://node") as client:
            return await send("agent_session", client, TARGET, random.Random(0))

    return asyncio.run(run()), bodies


def test_an_agent_session_sends_each_turn_back_with_the_calls_results_and_counts_the_cache() -> None:
    first = _sse(_chunk(_weather_call()), _chunk({}, "tool_calls"), _usage(90, 0), "data: [DONE]")
    outcome, bodies = _session(first)

    assert outcome.anomaly is None
    assert len(bodies) >= 2
    second = bodies[1]["messages"]
    assert isinstance(second, list)
    assistant, result = second[-2], second[-1]
    assert assistant["tool_calls"][0]["id"] == "call_1"
    assert assistant["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert (result["role"], result["tool_call_id"]) == ("tool", "call_1")
    # The first turn's prompt is not counted: only the later turns', whose usage said 80 cached each.
    assert outcome.later_turns == len(bodies) - 1
    assert outcome.later_prompt_tokens == sum(100 * turn for turn in range(2, len(bodies) + 1))
    assert outcome.later_cached_tokens == 80 * outcome.later_turns


@pytest.mark.parametrize(
    ("first", "broken_because"),
    [
        (_sse(_chunk(_weather_call(call_id="")), _chunk({}, "tool_calls"), _usage(90, 0), "data: [DONE]"), "ids"),
        (_sse(_chunk(_weather_call(name="rm_rf")), _chunk({}, "tool_calls"), _usage(90, 0), "data: [DONE]"), "offered"),
        (_sse(_chunk(_weather_call()), _chunk({}, "tool_calls"), "data: [DONE]"), "no usage"),
    ],
)
def test_an_agent_turn_needs_call_ids_offered_tools_and_its_usage(first: bytes, broken_because: str) -> None:
    outcome, _ = _session(first)
    assert outcome.anomaly is not None
    assert broken_because in outcome.anomaly


def test_long_prompts_stay_within_half_the_context() -> None:
    for context in (2048, 4096, 32768):
        low, high = Target(model="m", context_length=context).long_prompt_lines
        assert 2 <= low <= high
        assert high * 24 <= max(context // 2, 4 * 24)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_short_soak_on_a_fixture_model_passes_and_covers_every_kind(tmp_path: Path) -> None:
    report_path = tmp_path / "soak.json"
    arguments = [sys.executable, "-m", "bench.soak", str(FIXTURE), "--minutes", "0.25", "--concurrency", "3"]
    completed = subprocess.run(
        [*arguments, "--json", str(report_path)],
        cwd=REPOSITORY_ROOT,
        capture_output=True,
        text=True,
        timeout=220,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-4000:]
    report = SoakReport.model_validate_json(report_path.read_text())
    assert report.passed
    assert report.anomalies == []
    assert report.log_errors == []
    assert set(report.kinds) == set(MIX)
    assert all(tally.sent >= 1 for tally in report.kinds.values())
    assert report.idle_after_s is not None
    assert report.snapshots_written_after_s is not None
    assert report.memory
    assert all(sample.runner_rss_mb > 0 for sample in report.memory)
    assert max(sample.prefix_cache_mb for sample in report.memory) > 0  # from the node's /metrics
    assert [sample.queued_mb for sample in report.memory if sample.idle] == [0]  # all written in the end
    assert [sample.disk_mb > 0 for sample in report.memory if sample.idle] == [True]  # and on disk
    # Agent sessions' later turns reuse the earlier ones' KV (and the shared system prompt).
    assert report.session_reuse is not None
    assert report.session_reuse.cached_tokens > report.session_reuse.prompt_tokens / 2
    assert "Passed." in completed.stdout
