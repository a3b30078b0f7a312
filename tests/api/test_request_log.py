"""The per-request log line and record: what they say for a request that finished, failed before its prefill or was
left by its client (a scripted clock), and that `-q` hides the line on a real node."""

import time
from pathlib import Path

import pytest

from exo.api.request_log import RequestTimeline
from exo.shared.types.chunks import ErrorChunk, FinishChunk, PrefillProgressChunk, TokenChunk, Usage
from exo.shared.types.common import ModelId, NodeId
from exo.shared.types.request_record import ERROR_MESSAGE_CHARS
from tests.exo_server import fixture_model, running_exo


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def timeline(clock: Clock) -> RequestTimeline:
    return RequestTimeline("messages", ModelId("m"), NodeId("n1"), received_at=clock.now, clock=clock)


def test_a_finished_request_logs_its_tokens_times_and_finish_reason() -> None:
    clock = Clock()
    request = timeline(clock)
    clock.now = 100.5  # queued half a second
    request.observe(
        PrefillProgressChunk(prompt_tokens=1000, done_tokens=600, cached_tokens=600, disk_cached_tokens=200)
    )
    clock.now = 104.5
    request.observe(
        PrefillProgressChunk(prompt_tokens=1000, done_tokens=1000, cached_tokens=600, disk_cached_tokens=200)
    )
    clock.now = 104.75
    request.observe(TokenChunk(text="Hi"))
    assert request.where() == "decode"
    clock.now = 106.75  # 10 more tokens in 2 s
    usage = Usage(prompt_tokens=1000, completion_tokens=11, cached_tokens=600)
    request.observe(FinishChunk(finish_reason="stop", usage=usage))
    assert request.line(cancelled=False) == (
        "request messages model=m node=n1 prompt=1000 cached=600 (disk 200) queue=0.50s prefill=4.00s ttft=4.75s "
        "output=11 decode=5.0 tok/s finish=stop"
    )
    before = time.time()
    record = request.record(cancelled=False)
    assert before <= record.ended_at <= time.time()
    assert record.model_dump(exclude={"ended_at"}) == {
        "dialect": "messages",
        "model_id": "m",
        "served_by": "n1",
        "outcome": "finished",
        "finish_reason": "stop",
        "error_kind": None,
        "error": None,
        "prompt_tokens": 1000,
        "cached_tokens": 600,
        "disk_cached_tokens": 200,
        "completion_tokens": 11,
        "queue_seconds": 0.5,
        "prefill_seconds": 4.0,
        "time_to_first_token_seconds": 4.75,
        "decode_tokens_per_second": 5.0,
    }


def test_a_request_refused_before_its_prefill_logs_dashes_and_the_error_kind() -> None:
    clock = Clock()
    request = timeline(clock)
    assert request.where() == "queued"
    request.observe(ErrorChunk(error="context_length_exceeded", message="too long"))
    assert request.line(cancelled=True) == (
        "request messages model=m node=n1 prompt=- cached=- (disk -) queue=- prefill=- ttft=- output=- decode=- "
        "finish=error:context_length_exceeded"
    )
    record = request.record(cancelled=True)
    assert (record.outcome, record.error_kind, record.error) == ("failed", "context_length_exceeded", "too long")
    assert (record.prompt_tokens, record.time_to_first_token_seconds, record.decode_tokens_per_second) == (
        None,
        None,
        None,
    )


def test_a_long_error_message_is_cut_in_the_record_and_a_stream_that_just_stopped_is_a_failure() -> None:
    clock = Clock()
    request = timeline(clock)
    assert request.record(cancelled=False).outcome == "failed"
    assert request.record(cancelled=False).error == "ended without a result"
    assert request.line(cancelled=False).endswith("finish=ended without a result")
    request.observe(ErrorChunk(error="generation_failed", message="x" * 5000))
    assert request.record(cancelled=False).error == "x" * ERROR_MESSAGE_CHARS


def test_a_request_its_client_left_during_prefill_logs_cancelled_with_its_progress() -> None:
    clock = Clock()
    request = timeline(clock)
    clock.now = 101.0
    request.observe(PrefillProgressChunk(prompt_tokens=5000, done_tokens=0, cached_tokens=0))
    assert request.where() == "prefill 0/5000 tokens (0 cached)"
    assert request.line(cancelled=True) == (
        "request messages model=m node=n1 prompt=5000 cached=0 (disk 0) queue=1.00s prefill=- ttft=- output=- "
        "decode=- finish=cancelled"
    )
    record = request.record(cancelled=True)
    assert (record.outcome, record.error, record.prompt_tokens, record.cached_tokens) == ("cancelled", None, 5000, 0)
    assert record.queue_seconds == 1.0


@pytest.mark.slow  # a real node
def test_quiet_hides_the_request_lines(tmp_path: Path) -> None:
    with running_exo([fixture_model("tiny-qwen-tools")], tmp_path, ["-q"]) as server:
        reply = server.openai_client().chat.completions.create(
            model="tiny-qwen-tools", messages=[{"role": "user", "content": "Hello!"}], max_tokens=5
        )
        assert reply.choices[0].message.content
        log = server.log()
    assert "request chat.completions" not in log
    assert "exo.master" not in log  # nothing else at INFO either: the flag took effect
    assert "exo.api" not in log


def test_an_answer_its_client_did_not_get_is_cancelled_not_finished() -> None:
    """The model finished, but the client left (or its connection broke) before the answer's end reached it: the
    activity table must not list it as a success."""
    clock = Clock()
    request = timeline(clock)
    request.observe(TokenChunk(text="Hi"))
    request.observe(FinishChunk(finish_reason="stop", usage=Usage(prompt_tokens=10, completion_tokens=2)))
    record = request.record(cancelled=True)
    assert (record.outcome, record.error) == ("cancelled", None)
    assert record.completion_tokens == 2  # what the model did is still recorded
    assert request.line(cancelled=True).endswith("finish=cancelled")
    assert request.record(cancelled=False).outcome == "finished"
