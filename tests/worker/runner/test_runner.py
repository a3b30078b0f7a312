"""The runner's end of the pipe: a request it cannot read fails that task (or is ignored), and it keeps serving."""

import json
import multiprocessing
import time
from collections import deque
from collections.abc import Iterator
from multiprocessing.connection import Connection

import pytest

from exo.shared.types.chunks import ErrorChunk, FinishChunk, TokenChunk
from exo.shared.types.worker.runner_response import (
    RunnerBootstrap,
    RunnerDescribed,
    RunnerMemoryReport,
    RunnerReady,
    RunnerRequest,
    RunnerRequestAdapter,
    RunnerResponse,
    RunnerResponseAdapter,
    RunTask,
    Shutdown,
    StepOutput,
    TaskChunk,
    TaskDone,
)
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.runner.runner import runner_main
from tests.exo_server import fixture_model
from tests.fixtures.fixture_specs import GREETING_REPLY
from tests.worker.runner.tasks import MODEL, chat_task


class RunnerUnderTest:
    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.pipe_messages: list[RunnerResponse] = []
        """Every message read from the pipe, as sent (a serving step's StepOutput whole)."""
        self._unpacked: deque[RunnerResponse] = deque()
        self.memory_reports: list[RunnerMemoryReport] = []
        """The runner's memory reports, kept apart: they come whenever its memory changed, between any others."""

    def send(self, message: RunnerRequest) -> None:
        self.connection.send_bytes(RunnerRequestAdapter.dump_json(message))

    def poll(self, timeout: float) -> RunnerResponse | None:
        """The runner's next message, or None when none came within `timeout` seconds; a StepOutput reads as the
        TaskChunk and TaskDone messages it stands for, as the supervisor hands them on."""
        deadline = time.monotonic() + timeout
        while not self._unpacked:
            if not self.connection.poll(max(deadline - time.monotonic(), 0)):
                return None
            message = RunnerResponseAdapter.validate_json(self.connection.recv_bytes())
            self.pipe_messages.append(message)
            if isinstance(message, RunnerMemoryReport):
                self.memory_reports.append(message)
            else:
                self._unpacked.extend(message.task_messages() if isinstance(message, StepOutput) else [message])
        return self._unpacked.popleft()

    def receive(self, timeout: float = 60) -> RunnerResponse:
        message = self.poll(timeout)
        assert message is not None, "the runner did not answer"
        return message

    def until_loaded(self, timeout: float = 120) -> RunnerReady:
        """The load's two messages: the model described (before its weights load), then ready."""
        described = self.receive(timeout)
        assert isinstance(described, RunnerDescribed), f"expected the model's description first, got {described}"
        ready = self.receive(timeout)
        assert isinstance(ready, RunnerReady), f"expected ready, got {ready}"
        assert ready.metadata.tool_format == described.description.tool_format
        return ready

    def until_done(self, timeout: float = 120) -> list[RunnerResponse]:
        """Every message up to the next TaskDone, which must come within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        messages: list[RunnerResponse] = []
        while not messages or not isinstance(messages[-1], TaskDone):
            message = self.poll(deadline - time.monotonic())
            assert message is not None, "the runner did not finish the task in time"
            messages.append(message)
        return messages


@pytest.fixture(scope="module")
def runner() -> Iterator[RunnerUnderTest]:
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe(duplex=True)
    process = context.Process(target=runner_main, args=(child,), daemon=True)
    process.start()
    child.close()
    under_test = RunnerUnderTest(parent)
    under_test.send(RunnerBootstrap(model_path=str(fixture_model(MODEL)), shard=ShardAssignment()))
    under_test.until_loaded()
    yield under_test
    under_test.send(Shutdown())
    process.join(10)
    assert process.exitcode == 0


def assert_still_serving(runner: RunnerUnderTest) -> None:
    task = chat_task()
    runner.send(RunTask(task=task))
    *chunks, done = runner.until_done()
    assert isinstance(done, TaskDone)
    assert done.task_id == task.task_id
    texts = [message.chunk for message in chunks if isinstance(message, TaskChunk)]
    assert isinstance(texts[-1], FinishChunk)
    assert "".join(chunk.text for chunk in texts if isinstance(chunk, TokenChunk)) == GREETING_REPLY


def test_a_run_task_that_does_not_validate_fails_that_task_and_the_runner_keeps_serving(
    runner: RunnerUnderTest,
) -> None:
    task = json.loads(RunTask(task=chat_task()).model_dump_json())
    task["task"]["params"]["sampling"]["temperature"] = "hot"
    runner.connection.send_bytes(json.dumps(task).encode())
    chunk, done = runner.until_done()
    assert isinstance(chunk, TaskChunk)
    assert chunk.task_id == task["task"]["task_id"]
    assert isinstance(chunk.chunk, ErrorChunk)
    assert "could not read the request" in chunk.chunk.message
    assert done == TaskDone(task_id=task["task"]["task_id"])
    assert_still_serving(runner)


@pytest.mark.parametrize("payload", [b"not json", b'{"kind": "reboot"}', b'{"kind": "run_task", "task": 5}', b"\xff"])
def test_a_request_that_names_no_task_is_ignored_and_the_runner_keeps_serving(
    runner: RunnerUnderTest, payload: bytes
) -> None:
    runner.connection.send_bytes(payload)
    assert_still_serving(runner)
