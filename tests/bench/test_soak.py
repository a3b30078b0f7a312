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
    assert report.memory
    assert all(sample.runner_rss_mb > 0 for sample in report.memory)
    assert max(sample.prefix_cache_mb for sample in report.memory) > 0  # from the node's /metrics
    assert [sample.queued_mb for sample in report.memory if sample.idle] == [0]  # written once the runner idled
    assert "Passed." in completed.stdout
