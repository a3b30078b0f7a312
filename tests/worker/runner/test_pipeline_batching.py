"""A model split over 2 and 3 real runner processes (by layers, and over 2 by its matrices) decodes its requests
together, and each one still gets exactly the answer it gets alone on one whole-model runner.

Rank 0 batches every kind of request at once (plain text, streamed and parallel tool calls, `tool_choice` required
and named, a `json_schema` answer, seeded sampling with and without penalties and a grammar) and each answer is
compared with that request's answer alone; every rank's prefix cache then holds what the batch computed. On the
endless model (no end-of-sequence ids, so a request lasts exactly its max_tokens), requests join a batch that is
already decoding and one of them is cancelled: the others' answers do not change.
"""

import time
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest
from anyio.streams.memory import MemoryObjectReceiveStream

from exo.shared.types.chunks import Chunk, ErrorChunk, FinishChunk, PrefillProgressChunk, TokenChunk
from exo.shared.types.tasks import GenerationTask, SamplingParams
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.runner.supervisor import RunnerSupervisor
from tests.exo_server import fixture_model
from tests.fixtures.endless_model import endless_copy
from tests.worker.runner.pipelines import (
    DEEP_MODEL,
    comparable,
    pipeline_of,
    run_task,
    running_ranks,
    task,
    tensor_split_of,
)
from tests.worker.runner.test_pipeline_runner import cases


def _answer(chunks: Sequence[Chunk]) -> list[Chunk]:
    """What a request answered, without how much of its prompt a cache held (that depends on what ran before it:
    requests batched together all start before any of them is stored)."""
    answer: list[Chunk] = []
    for chunk in comparable(chunks):
        if isinstance(chunk, PrefillProgressChunk):
            continue
        if isinstance(chunk, FinishChunk):
            usage = chunk.usage.model_copy(update={"cached_tokens": 0, "disk_cached_tokens": 0})
            answer.append(chunk.model_copy(update={"usage": usage}))
        else:
            answer.append(chunk)
    return answer


def _batch_cases() -> dict[str, GenerationTask]:
    return {
        **cases(),
        "seeded sampling": task("Tell me a story.", sampling=SamplingParams(temperature=0.9, seed=3, max_tokens=48)),
    }


async def _timed(stream: MemoryObjectReceiveStream[Chunk]) -> tuple[list[Chunk], float, float]:
    """The chunks of one request, when its first answer chunk arrived and when its last did."""
    chunks: list[Chunk] = []
    first = 0.0
    async with stream:
        async for chunk in stream:
            if not first and not isinstance(chunk, PrefillProgressChunk):
                first = time.monotonic()
            chunks.append(chunk)
    return chunks, first, time.monotonic()


async def _all_at_once(
    leader: RunnerSupervisor, tasks: dict[str, GenerationTask]
) -> dict[str, tuple[list[Chunk], float, float]]:
    results: dict[str, tuple[list[Chunk], float, float]] = {}

    async def one(name: str, stream: MemoryObjectReceiveStream[Chunk]) -> None:
        results[name] = await _timed(stream)

    async with anyio.create_task_group() as group:
        for name, chat in tasks.items():
            group.start_soon(one, name, leader.submit(chat))
    return results


def _most_at_once(spans: Sequence[tuple[float, float]]) -> int:
    """The most requests streaming their answers at the same moment."""
    return max(sum(start <= moment < end for start, end in spans) for moment, _ in spans)


SPLITS: dict[str, list[ShardAssignment]] = {
    "2 ranks": pipeline_of((3, 1)),
    "3 ranks": pipeline_of((1, 2, 1)),
    "2 ranks, tensor": tensor_split_of(2, 4),
}


@pytest.mark.parametrize("split", list(SPLITS))
async def test_requests_batched_over_a_split_model_each_get_their_answer_alone(split: str) -> None:
    model_path = fixture_model(DEEP_MODEL)
    async with running_ranks(model_path, [ShardAssignment()]) as (whole,):
        alone = {name: _answer(await run_task(whole, chat)) for name, chat in _batch_cases().items()}
    async with running_ranks(model_path, SPLITS[split]) as supervisors:
        leader = supervisors[0]
        assert leader.metadata is not None
        assert leader.metadata.batch_size == 8
        together = await _all_at_once(leader, _batch_cases())
        for name, expected in alone.items():
            assert _answer(together[name][0]) == expected, name
        # They were decoded side by side, not one after another.
        assert _most_at_once([(first, last) for _, first, last in together.values()]) >= 4
        # Every rank filed each member's cache as it left the batch: asked again, a request reuses all of its
        # prompt but the token that produces the first logits, on every rank.
        again = await run_task(leader, _batch_cases()["streamed tool call"])
        assert _answer(again) == alone["streamed tool call"]
        finish = again[-1]
        assert isinstance(finish, FinishChunk)
        assert finish.usage.cached_tokens == finish.usage.prompt_tokens - 1
        assert all(supervisor.status == "ready" for supervisor in supervisors)


LONG = SamplingParams(max_tokens=120)
SHORT = SamplingParams(max_tokens=40)


@pytest.fixture(scope="module")
def endless_deep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return endless_copy(tmp_path_factory.mktemp("models"), source="tiny-qwen-tools-deep")


Arrivals = list[tuple[Chunk, float]]


async def _read(stream: MemoryObjectReceiveStream[Chunk], arrivals: Arrivals) -> None:
    async with stream:
        async for chunk in stream:
            arrivals.append((chunk, time.monotonic()))


async def _until_tokens(arrivals: Arrivals, count: int) -> None:
    with anyio.fail_after(60):
        while sum(isinstance(chunk, TokenChunk) for chunk, _ in arrivals) < count:
            await anyio.sleep(0.02)


def _chunks(arrivals: Arrivals) -> list[Chunk]:
    return [chunk for chunk, _ in arrivals]


def _first_token_at(arrivals: Arrivals) -> float:
    return next(moment for chunk, moment in arrivals if isinstance(chunk, TokenChunk))


async def test_members_join_a_running_batch_and_a_cancelled_one_leaves_the_others_intact(endless_deep: Path) -> None:
    first, joining = task("Hello!", sampling=LONG), task("Tell me a story.", sampling=SHORT)
    cancelled = task("What is the weather in Paris?", sampling=LONG)
    async with running_ranks(endless_deep, [ShardAssignment()]) as (whole,):
        alone = {chat.task_id: _answer(await run_task(whole, chat)) for chat in (first, joining)}
    arrivals: dict[str, Arrivals] = {"first": [], "joining": [], "cancelled": []}
    async with running_ranks(endless_deep, pipeline_of((2, 2))) as (leader, _):
        with anyio.fail_after(180):
            async with anyio.create_task_group() as group:
                group.start_soon(_read, leader.submit(first), arrivals["first"])
                await _until_tokens(arrivals["first"], 5)
                # Two requests join the batch while the first decodes; one of them is cancelled mid-answer.
                group.start_soon(_read, leader.submit(joining), arrivals["joining"])
                group.start_soon(_read, leader.submit(cancelled), arrivals["cancelled"])
                await _until_tokens(arrivals["cancelled"], 5)
                leader.cancel(cancelled.task_id)
        assert _answer(_chunks(arrivals["first"])) == alone[first.task_id]
        assert _answer(_chunks(arrivals["joining"])) == alone[joining.task_id]
        # The joining request streamed its whole answer while the first one was decoding.
        first_ended, joining_ended = arrivals["first"][-1][1], arrivals["joining"][-1][1]
        assert _first_token_at(arrivals["first"]) < _first_token_at(arrivals["joining"]) < joining_ended < first_ended
        assert not any(isinstance(chunk, FinishChunk | ErrorChunk) for chunk in _chunks(arrivals["cancelled"]))
        outcomes = {summary.task_id: summary.outcome for summary in leader.recent_tasks}
        assert outcomes == {first.task_id: "finished", joining.task_id: "finished", cancelled.task_id: "cancelled"}
