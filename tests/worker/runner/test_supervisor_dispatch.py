"""Whatever fails between "dequeued" and "running in the runner" fails that task alone: the queue moves on.

A real supervisor drives a real runner subprocess (tiny-qwen-tools); the failures are real too — a task whose text
cannot be encoded for the pipe, and a pipe write to a runner that has died.
"""

import os
import select
import signal
import time
from collections.abc import Sequence

import anyio

from exo.shared.types.chunks import Chunk, ErrorChunk, FinishChunk, TokenChunk
from tests.fixtures.fixture_specs import GREETING_REPLY
from tests.worker.runner.tasks import chat_task, collect, running_supervisor


def reply_text(chunks: Sequence[Chunk]) -> str:
    assert isinstance(chunks[-1], FinishChunk), chunks
    return "".join(chunk.text for chunk in chunks if isinstance(chunk, TokenChunk))


def wait_until_exited(pid: int, timeout: float = 30.0) -> None:
    """Block (without yielding to the event loop) until every thread of child `pid` has exited, so its end of the
    pipe is closed, while the supervisor, whose loop is blocked here, has not yet noticed.

    The kernel reports a child as exited only once its last thread has gone, and a thread lets go of its files
    before that; the thread group leader alone (its /proc fd list, or its zombie state) can look dead while another
    thread still holds the socket, and a write then succeeds. WNOWAIT leaves the child for the supervisor to reap.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return
        except ChildProcessError:  # already reaped: gone all the more
            return
        time.sleep(0.01)
    raise TimeoutError(f"process {pid} did not exit")


def wait_until_hung_up(fileno: int, timeout: float = 10.0) -> None:
    """Block until the other end of the socket `fileno` is closed. The kernel releases a killed process's sockets
    a moment after its file table (deferred fput): until then a write to the pipe still succeeds."""
    poller = select.poll()
    poller.register(fileno, select.POLLHUP)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(events & select.POLLHUP for _, events in poller.poll(10)):
            return
    raise TimeoutError("the runner's end of the pipe stayed open")


async def test_a_task_that_cannot_be_encoded_fails_alone_and_the_queue_moves_on() -> None:
    # One task at a time, so the poisoned task waits in the queue behind the first.
    async with running_supervisor(batch_size=1) as supervisor:
        first = supervisor.submit(chat_task())
        poisoned = supervisor.submit(chat_task("\ud800"))  # a lone surrogate: not encodable as UTF-8
        after = supervisor.submit(chat_task())
        assert len(supervisor.queued_task_ids) == 2

        assert reply_text(await collect(first)) == GREETING_REPLY
        (error,) = await collect(poisoned)
        assert isinstance(error, ErrorChunk)
        assert "could not be handed to the model runner" in error.message
        assert reply_text(await collect(after)) == GREETING_REPLY
        assert [task.outcome for task in supervisor.recent_tasks] == ["finished", "failed", "finished"]
        assert supervisor.restarts == 0
        assert supervisor.status == "ready"


async def test_a_pipe_write_that_fails_at_dispatch_fails_that_task_and_the_next_one_runs_on_a_new_runner() -> None:
    async with running_supervisor() as supervisor:
        pid = supervisor.pid
        assert pid is not None
        connection = supervisor._connection  # pyright: ignore[reportPrivateUsage] -- the pipe the dispatch writes to
        assert connection is not None
        os.kill(pid, signal.SIGKILL)
        wait_until_exited(pid)
        wait_until_hung_up(connection.fileno())
        assert supervisor.status == "ready"  # the supervisor has not seen the exit: dispatch writes to a dead pipe

        unsent = supervisor.submit(chat_task())
        queued = supervisor.submit(chat_task())

        (error,) = await collect(unsent)
        assert isinstance(error, ErrorChunk)
        assert error.error == "runner_stopped"
        assert "stopped before this request started" in error.message
        with anyio.fail_after(120):
            assert reply_text(await collect(queued)) == GREETING_REPLY
        assert supervisor.pid != pid
        assert supervisor.restarts == 1
        assert [task.outcome for task in supervisor.recent_tasks] == ["failed", "finished"]
