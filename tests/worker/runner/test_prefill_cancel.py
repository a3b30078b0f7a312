"""A cancel reaches a real runner between prefill steps (a piece pauses between its layers): a long prefill stops
within a second and the next request starts at once."""

import multiprocessing
import time
from collections.abc import Iterator

import pytest

from exo.shared.types.chunks import FinishChunk, PrefillProgressChunk
from exo.shared.types.worker.runner_response import (
    CancelTask,
    RunnerBootstrap,
    RunnerResponse,
    RunTask,
    Shutdown,
    TaskChunk,
    TaskDone,
)
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.runner.runner import runner_main
from tests.fixtures.endless_model import endless_copy
from tests.worker.runner.tasks import chat_task
from tests.worker.runner.test_runner import RunnerUnderTest

# The deep fixture (4 layers) with a context long enough for a prompt whose prefill takes many seconds here.
CONTEXT_LENGTH = 32768
LONG_PROMPT = "word " * 4000
CANCEL_AFTER_SECONDS = 2.0
CANCEL_WITHIN_SECONDS = 1.0
"""The issue's bound. The runner reads its messages after every step: a quarter-second slice of a piece's layers
plus the one layer running when it ends (the fixture's take milliseconds), so the rest is margin for a loaded
machine's scheduling."""


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunnerUnderTest]:
    model = endless_copy(tmp_path_factory.mktemp("slow"), source="tiny-qwen-tools-deep", context_length=CONTEXT_LENGTH)
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe(duplex=True)
    process = context.Process(target=runner_main, args=(child,), daemon=True)
    process.start()
    child.close()
    under_test = RunnerUnderTest(parent)
    under_test.send(RunnerBootstrap(model_path=str(model), shard=ShardAssignment(), prefix_cache_bytes=1 << 28))
    under_test.until_loaded()
    yield under_test
    under_test.send(Shutdown())
    process.join(10)


def _finish(messages: list[RunnerResponse]) -> FinishChunk:
    chunks = [message.chunk for message in messages if isinstance(message, TaskChunk)]
    assert isinstance(chunks[-1], FinishChunk)
    return chunks[-1]


def test_a_cancel_during_a_long_prefill_frees_the_runner_within_a_second(runner: RunnerUnderTest) -> None:
    long_task = chat_task(LONG_PROMPT, max_tokens=4)
    runner.send(RunTask(task=long_task))
    time.sleep(CANCEL_AFTER_SECONDS)
    progress: list[PrefillProgressChunk] = []
    while (message := runner.poll(0)) is not None:
        assert isinstance(message, TaskChunk)
        assert isinstance(message.chunk, PrefillProgressChunk), "the prefill ended before the cancel"
        progress.append(message.chunk)
    # Progress came piece by piece while the prefill went on.
    assert len(progress) > 2
    assert 0 < progress[-1].done_tokens < progress[-1].prompt_tokens

    cancelled_at = time.monotonic()
    runner.send(CancelTask(task_id=long_task.task_id))
    done = runner.until_done(timeout=30)[-1]
    stopped_after = time.monotonic() - cancelled_at

    assert isinstance(done, TaskDone)
    assert (done.task_id, done.cancelled, done.generated_tokens) == (long_task.task_id, True, 0)
    # Its usage so far goes with the cancel (the runner's counters take it): the whole prompt, nothing generated.
    assert done.usage is not None
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (progress[-1].prompt_tokens, 0)
    assert stopped_after < CANCEL_WITHIN_SECONDS, f"the runner stopped {stopped_after:.2f} s after the cancel"
    # The runner is free: a short request is answered at once.
    started = time.monotonic()
    runner.send(RunTask(task=chat_task("Hello!", max_tokens=4)))
    _finish(runner.until_done(timeout=30))
    assert time.monotonic() - started < 5
