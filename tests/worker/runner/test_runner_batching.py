"""The runner decodes the tasks it is given together: chunks of every running task interleave, each task ends with
its own TaskDone, and a cancel stops one task without disturbing the others.

A real runner subprocess serving tiny-qwen-tools with its end-of-sequence ids removed, so a task lasts exactly its
max_tokens and several are certainly running at once.
"""

import multiprocessing
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exo.shared.types.chunks import FinishChunk, PrefillProgressChunk, TokenChunk
from exo.shared.types.common import TaskId
from exo.shared.types.worker.decode_settings import DecodeSettings
from exo.shared.types.worker.runner_response import (
    CancelTask,
    RunnerBootstrap,
    RunTask,
    Shutdown,
    StepOutput,
    TaskChunk,
    TaskDone,
)
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.runner.runner import runner_main
from exo.worker.runner.step_sender import STREAM_WINDOW_SECONDS
from tests.fixtures.endless_model import endless_copy
from tests.worker.runner.tasks import chat_task
from tests.worker.runner.test_runner import RunnerUnderTest

LONG = 400


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunnerUnderTest]:
    model: Path = endless_copy(tmp_path_factory.mktemp("models"))
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe(duplex=True)
    process = context.Process(target=runner_main, args=(child,), daemon=True)
    process.start()
    child.close()
    under_test = RunnerUnderTest(parent)
    under_test.send(
        RunnerBootstrap(model_path=str(model), shard=ShardAssignment(), decode=DecodeSettings(batch_size=4))
    )
    ready = under_test.until_loaded()
    assert ready.metadata.batch_size == 4
    yield under_test
    under_test.send(Shutdown())
    process.join(10)
    assert process.exitcode == 0


def run_until_all_done(runner: RunnerUnderTest, task_ids: set[TaskId]) -> list[TaskChunk | TaskDone]:
    """Every message until each of `task_ids` has its TaskDone, in arrival order."""
    messages: list[TaskChunk | TaskDone] = []
    remaining = set(task_ids)
    while remaining:
        message = runner.receive()
        assert isinstance(message, TaskChunk | TaskDone), message
        messages.append(message)
        if isinstance(message, TaskDone):
            remaining.discard(message.task_id)
    return messages


def text_of(messages: list[TaskChunk | TaskDone], task_id: TaskId) -> str:
    chunks = [message.chunk for message in messages if isinstance(message, TaskChunk) and message.task_id == task_id]
    return "".join(chunk.text for chunk in chunks if isinstance(chunk, TokenChunk))


def test_tasks_given_together_decode_together_and_each_gets_its_own_answer(runner: RunnerUnderTest) -> None:
    alone = {}
    for content in ("Hello!", "What is the weather in Paris?", "Tell me a story."):
        one = chat_task(content, max_tokens=24)
        runner.send(RunTask(task=one))
        alone[content] = text_of(run_until_all_done(runner, {one.task_id}), one.task_id)

    tasks = {content: chat_task(content, max_tokens=24) for content in alone}
    for one in tasks.values():
        runner.send(RunTask(task=one))
    messages = run_until_all_done(runner, {one.task_id for one in tasks.values()})
    first_done = next(index for index, message in enumerate(messages) if isinstance(message, TaskDone))
    # Every task streamed before any of them finished: they were decoded side by side, not one after another.
    assert {message.task_id for message in messages[:first_done]} == {one.task_id for one in tasks.values()}
    for content, one in tasks.items():
        assert text_of(messages, one.task_id) == alone[content]
        done = next(m for m in messages if isinstance(m, TaskDone) and m.task_id == one.task_id)
        assert (done.generated_tokens, done.cancelled) == (24, False)


def _content_of(message: TaskChunk | TaskDone, task_id: TaskId) -> bool:
    """A chunk of the task's answer (not its prefill progress)."""
    return (
        isinstance(message, TaskChunk)
        and message.task_id == task_id
        and not isinstance(message.chunk, PrefillProgressChunk)
    )


def test_a_cancel_stops_one_running_task_and_the_others_finish_unchanged(runner: RunnerUnderTest) -> None:
    reference = chat_task("Hello!", max_tokens=LONG)
    runner.send(RunTask(task=reference))
    expected = text_of(run_until_all_done(runner, {reference.task_id}), reference.task_id)

    kept, cancelled = chat_task("Hello!", max_tokens=LONG), chat_task("Tell me a story.", max_tokens=LONG)
    runner.send(RunTask(task=kept))
    runner.send(RunTask(task=cancelled))
    messages: list[TaskChunk | TaskDone] = []
    while sum(_content_of(m, cancelled.task_id) for m in messages) < 5:
        message = runner.receive()
        assert isinstance(message, TaskChunk | TaskDone)
        messages.append(message)
    runner.send(CancelTask(task_id=cancelled.task_id))
    messages += run_until_all_done(runner, {kept.task_id, cancelled.task_id})

    cancelled_done = next(m for m in messages if isinstance(m, TaskDone) and m.task_id == cancelled.task_id)
    assert cancelled_done.cancelled
    assert 5 <= cancelled_done.generated_tokens < LONG
    cancelled_chunks = [m.chunk for m in messages if isinstance(m, TaskChunk) and m.task_id == cancelled.task_id]
    assert not any(isinstance(chunk, FinishChunk) for chunk in cancelled_chunks)
    assert text_of(messages, kept.task_id) == expected
    kept_done = next(m for m in messages if isinstance(m, TaskDone) and m.task_id == kept.task_id)
    assert (kept_done.generated_tokens, kept_done.cancelled) == (LONG, False)


def test_a_batched_step_sends_one_message_for_all_its_streams(runner: RunnerUnderTest) -> None:
    tokens = 24
    tasks = [chat_task(content, max_tokens=tokens) for content in ("Hi", "Hello!", "Tell me a story.", "Paris?")]
    read_before = len(runner.pipe_messages)
    for one in tasks:
        runner.send(RunTask(task=one))
    messages = run_until_all_done(runner, {one.task_id for one in tasks})
    pipe = runner.pipe_messages[read_before:]

    # Answers travel only in step messages; a lone TaskChunk is a prompt's progress when it is admitted.
    assert all(isinstance(m.chunk, PrefillProgressChunk) for m in pipe if isinstance(m, TaskChunk))
    steps = [m for m in pipe if isinstance(m, StepOutput)]
    ends = [m for m in messages if isinstance(m, TaskDone)]
    assert sorted(done.generated_tokens for done in ends) == [tokens] * len(tasks)
    answer_chunks = sum(_content_of(m, one.task_id) for m in messages for one in tasks)
    # Four tasks of 24 tokens each, decoded side by side: about 24 step messages, not one per chunk.
    assert len(steps) <= tokens + len(tasks) < answer_chunks
    assert any(len({stream.task_id for stream in step.streams}) == len(tasks) for step in steps)
    # The host-overhead meter counts a decode step per step message at most (the first tokens come from the prompts'
    # pass, which is no decode step).
    last_done = ends[-1]
    assert last_done.step_times is not None
    assert last_done.step_times[len(tasks)].steps >= tokens - len(tasks)


def test_a_fast_models_steps_share_messages_at_most_a_window_apart(runner: RunnerUnderTest) -> None:
    """A stream's chunks travel in a message at most every STREAM_WINDOW_SECONDS (its first token and its end at
    once), not one message a step: every token still arrives, in order, the end last."""
    task = chat_task("Tell me a story.", max_tokens=LONG)
    read_before = len(runner.pipe_messages)
    start = time.monotonic()
    runner.send(RunTask(task=task))
    messages = run_until_all_done(runner, {task.task_id})
    elapsed = time.monotonic() - start
    steps = [m for m in runner.pipe_messages[read_before:] if isinstance(m, StepOutput)]
    done = messages[-1]
    assert isinstance(done, TaskDone)
    assert done.generated_tokens == LONG
    assert isinstance(messages[-2], TaskChunk)
    assert isinstance(messages[-2].chunk, FinishChunk)
    counts = [stream.generated_tokens for step in steps for stream in step.streams]
    assert None not in counts
    assert counts == sorted(count or 0 for count in counts)
    assert counts[-1] == LONG
    # Each message but the first token's and the end's waited a window after the one before it.
    assert 2 <= len(steps) <= elapsed / STREAM_WINDOW_SECONDS + 2
