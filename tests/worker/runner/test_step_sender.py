"""The serving loop's sender (`step_sender.py`, issue 36): streamed chunks of fast steps travel together, at most a
window apart, and nothing that decides latency or order waits: a task's first chunks, any end, a flush before other
messages, a step before a prefill. Driven over a real pipe, read back as the supervisor reads it."""

import multiprocessing
from collections.abc import Iterator

import pytest

from exo.shared.types.chunks import Chunk, FinishChunk, TokenChunk, Usage
from exo.shared.types.common import TaskId
from exo.shared.types.worker.runner_response import RunnerResponseAdapter, StepOutput, TaskChunk, TaskDone
from exo.worker.engines.mlx.generator.scheduler import RequestUpdate
from exo.worker.runner.channel import RunnerChannel
from exo.worker.runner.step_sender import StepSender

A, B = TaskId("a"), TaskId("b")


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Wire:
    """A sender over a real pipe, and what the supervisor's end has read."""

    def __init__(self) -> None:
        ours, theirs = multiprocessing.Pipe(duplex=True)
        self._ours, self._theirs = ours, theirs
        self.clock = _Clock()
        self._channel = RunnerChannel(ours)
        self.sender = StepSender(self._channel, window=0.02, clock=self.clock)

    def close(self) -> None:
        self._channel.close()
        self._ours.close()
        self._theirs.close()

    def messages(self) -> list[StepOutput]:
        read: list[StepOutput] = []
        self._channel.flush()  # the channel's thread writes what was sent
        while self._theirs.poll(0):
            message = RunnerResponseAdapter.validate_json(self._theirs.recv_bytes())
            assert isinstance(message, StepOutput)
            read.append(message)
        return read


@pytest.fixture
def wire() -> Iterator[_Wire]:
    opened = _Wire()
    yield opened
    opened.close()


def _token(task: TaskId, text: str, generated: int, *, done: bool = False) -> RequestUpdate:
    chunks: list[Chunk] = [TokenChunk(text=text)]
    if done:
        chunks.append(FinishChunk(finish_reason="stop", usage=Usage(prompt_tokens=1, completion_tokens=generated)))
    return RequestUpdate(task_id=task, chunks=chunks, done=done, generated_tokens=generated)


def _texts(message: StepOutput, task: TaskId) -> list[str]:
    return [
        chunk.text
        for stream in message.streams
        if stream.task_id == task
        for chunk in stream.chunks
        if isinstance(chunk, TokenChunk)
    ]


def test_a_tasks_first_chunks_go_at_once_and_later_ones_wait_for_the_window(wire: _Wire) -> None:
    wire.sender.step([_token(A, "x", 1)])
    first = wire.messages()
    assert [_texts(message, A) for message in first] == [["x"]]
    for index, text in enumerate("yzw"):
        wire.clock.now += 0.005
        wire.sender.step([_token(A, text, index + 2)])
    assert wire.messages() == []  # 15 ms since the last message
    wire.clock.now += 0.006
    wire.sender.step([_token(A, "v", 5)])
    gathered = wire.messages()
    assert len(gathered) == 1
    assert _texts(gathered[0], A) == ["y", "z", "w", "v"]
    assert gathered[0].streams[0].generated_tokens == 5  # the count as of its last chunk


def test_an_end_sends_what_every_task_held_first_then_the_end(wire: _Wire) -> None:
    wire.sender.step([_token(A, "a1", 1), _token(B, "b1", 1)])
    wire.messages()
    wire.sender.step([_token(A, "a2", 2), _token(B, "b2", 2)])
    assert wire.messages() == []
    wire.sender.step([_token(A, "a3", 3, done=True), _token(B, "b3", 3)])
    (message,) = wire.messages()
    assert _texts(message, A) == ["a2", "a3"]
    assert _texts(message, B) == ["b2", "b3"]
    assert [(end.task_id, end.generated_tokens) for end in message.endings] == [(A, 3)]
    # The supervisor hands on every chunk before the end.
    handed = message.task_messages()
    assert isinstance(handed[-1], TaskDone)
    assert all(isinstance(one, TaskChunk) for one in handed[:-1])


def test_an_end_with_no_chunk_of_its_own_still_ends(wire: _Wire) -> None:
    wire.sender.step([_token(A, "a1", 1)])
    wire.messages()
    wire.sender.step([_token(A, "a2", 2)])
    wire.sender.step([RequestUpdate(task_id=A, chunks=[], done=True, generated_tokens=2)])
    (message,) = wire.messages()
    assert _texts(message, A) == ["a2"]
    assert [end.task_id for end in message.endings] == [A]


def test_a_flush_or_a_prefill_ahead_sends_what_is_held(wire: _Wire) -> None:
    wire.sender.step([_token(A, "a1", 1)])
    wire.messages()
    wire.sender.flush()
    assert wire.messages() == []  # nothing held, nothing sent
    wire.sender.step([_token(A, "a2", 2)])
    wire.sender.flush()
    assert [_texts(message, A) for message in wire.messages()] == [["a2"]]
    wire.sender.step([_token(A, "a3", 3)], quick_next=False)
    assert [_texts(message, A) for message in wire.messages()] == [["a3"]]


def test_a_task_that_ended_starts_streaming_anew(wire: _Wire) -> None:
    """A task id is streaming only between its first chunks and its end: the next task's first chunk goes at
    once even if the id repeats (as it does not in service, but the sender must not depend on it)."""
    wire.sender.step([_token(A, "a1", 1, done=True)])
    wire.messages()
    wire.sender.step([_token(A, "again", 1)])
    assert [_texts(message, A) for message in wire.messages()] == [["again"]]
