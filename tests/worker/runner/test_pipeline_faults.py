"""A pipeline of real runner processes under cancellation and faults, split by layers or by matrices (tensor).

A cancel stops every rank within a token and the next request runs. A rank killed while two requests decode together
ends each of them with one error within 10 s; the surviving rank's process exits rather than spin, the supervisors
start both anew, the ranks find each other again and the next request succeeds. A rank whose peer starts only after
its ring deadline ends (mlx waits holding the GIL: the kernel's alarm ends it) and is started again, not counted as
a load failure, until the pipeline forms. The model is tiny-qwen-tools-deep without end-of-sequence ids, so a
request lasts as long as the test needs.
"""

import os
import signal
import time
from pathlib import Path

import anyio
import psutil
import pytest
from anyio.streams.memory import MemoryObjectReceiveStream

from exo.shared.types.chunks import Chunk, ErrorChunk, FinishChunk, TokenChunk
from exo.shared.types.tasks import SamplingParams
from exo.shared.types.worker.shards import Parallelism, ShardAssignment
from exo.worker.ring_deadline import RING_JOIN_TIMEOUT_VARIABLE
from exo.worker.runner.supervisor import RunnerSupervisor
from tests.fixtures.endless_model import endless_copy
from tests.worker.runner.pipelines import (
    pipeline_of,
    rank_supervisor,
    run_task,
    running_ranks,
    task,
    tensor_split_of,
)
from tests.worker.runner.tasks import until_ready

ENDLESS = SamplingParams(max_tokens=4000)
SHORT = SamplingParams(max_tokens=8)


SPLITS: tuple[Parallelism, ...] = ("pipeline", "tensor")


def _two_ranks(split: Parallelism) -> list[ShardAssignment]:
    """tiny-qwen-tools-deep's 4 layers over 2 ranks: 2 each, or all 4 with half of their heads each."""
    return pipeline_of((2, 2)) if split == "pipeline" else tensor_split_of(2, 4)


@pytest.fixture(scope="module")
def endless_deep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return endless_copy(tmp_path_factory.mktemp("models"), source="tiny-qwen-tools-deep")


async def _first_tokens(stream: MemoryObjectReceiveStream[Chunk], count: int) -> None:
    with anyio.fail_after(60):
        seen = 0
        while seen < count:
            if isinstance(await stream.receive(), TokenChunk):
                seen += 1


async def _rest(stream: MemoryObjectReceiveStream[Chunk]) -> list[Chunk]:
    async with stream:
        return [chunk async for chunk in stream]


async def _assert_serves(leader: RunnerSupervisor) -> None:
    chunks = await run_task(leader, task("Hello!", sampling=SHORT))
    finish = chunks[-1]
    assert isinstance(finish, FinishChunk), chunks
    assert finish.usage.completion_tokens == 8


@pytest.mark.parametrize("split", SPLITS)
async def test_a_cancel_stops_every_rank_and_the_next_request_runs(endless_deep: Path, split: Parallelism) -> None:
    async with running_ranks(endless_deep, _two_ranks(split)) as (leader, _):
        long = task("Hello!", sampling=ENDLESS)
        stream = leader.submit(long)
        await _first_tokens(stream, 5)
        leader.cancel(long.task_id)
        with anyio.fail_after(30):
            rest = await _rest(stream)
        assert not any(isinstance(chunk, (FinishChunk, ErrorChunk)) for chunk in rest)
        await _assert_serves(leader)
        outcomes = [summary.outcome for summary in leader.recent_tasks]
        assert outcomes == ["cancelled", "finished"]


async def _replaced(supervisor: RunnerSupervisor, old_pid: int | None) -> None:
    """Wait until `supervisor` runs a new process that is ready."""
    with anyio.fail_after(240):
        while supervisor.pid == old_pid or supervisor.status != "ready":
            await anyio.sleep(0.2)


async def _idle(pid: int | None) -> bool:
    """The process used less than a fifth of a core over two seconds."""
    assert pid is not None
    process = psutil.Process(pid)
    before = process.cpu_times()
    await anyio.sleep(2)
    after = process.cpu_times()
    return (after.user + after.system) - (before.user + before.system) < 0.4


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("killed_rank", [1, 0], ids=["rank 1 killed", "rank 0 killed"])
async def test_a_killed_rank_fails_the_request_within_10_s_and_the_pipeline_comes_back(
    endless_deep: Path, killed_rank: int, split: Parallelism
) -> None:
    async with running_ranks(endless_deep, _two_ranks(split)) as supervisors:
        leader = supervisors[0]
        pids = [supervisor.pid for supervisor in supervisors]
        assert all(pid is not None for pid in pids)
        # Two requests decode together in the pipeline's batch when the rank dies.
        streams = [leader.submit(task(content, sampling=ENDLESS)) for content in ("Hello!", "Tell me a story.")]
        for stream in streams:
            await _first_tokens(stream, 5)
        killed = pids[killed_rank]
        assert killed is not None
        os.kill(killed, signal.SIGKILL)
        started = time.monotonic()
        rests: list[list[Chunk]] = []
        with anyio.fail_after(10):
            for stream in streams:
                rests.append(await _rest(stream))
        assert time.monotonic() - started < 10
        for rest in rests:
            errors = [chunk for chunk in rest if isinstance(chunk, ErrorChunk)]
            assert len(errors) == 1
            assert rest[-1] == errors[0]
            assert errors[0].error == "runner_crashed"
        # The survivor does not stay behind spinning: its process exits and is replaced.
        survivor = pids[1 - killed_rank]
        assert survivor is not None
        with anyio.fail_after(10):
            while psutil.pid_exists(survivor) and psutil.Process(survivor).status() != psutil.STATUS_ZOMBIE:
                await anyio.sleep(0.2)
        for supervisor, pid in zip(supervisors, pids, strict=True):
            await _replaced(supervisor, pid)
        await _assert_serves(leader)
        assert [await _idle(supervisor.pid) for supervisor in supervisors] == [True, True]


async def test_a_rank_killed_while_idle_makes_the_other_leave_at_once_and_the_pipeline_comes_back(
    endless_deep: Path,
) -> None:
    async with running_ranks(endless_deep, pipeline_of((3, 1))) as supervisors:
        leader, follower = supervisors
        pids = [leader.pid, follower.pid]
        assert follower.pid is not None
        os.kill(follower.pid, signal.SIGKILL)
        # Rank 0 sees its task connection close (nothing runs, so the ring cannot tell it) and leaves.
        with anyio.fail_after(10):
            while leader.pid == pids[0]:
                await anyio.sleep(0.2)
        for supervisor, pid in zip(supervisors, pids, strict=True):
            await _replaced(supervisor, pid)
        await _assert_serves(leader)


async def test_a_rank_whose_peer_starts_after_its_ring_deadline_is_started_again_until_the_pipeline_forms(
    endless_deep: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The follower alone first (as when the leader's node is still copying the model's files): its ring does not
    form within the deadline, its process ends and its supervisor starts it again, neither giving up nor counting a
    load failure; once the leader starts, the ring forms and the pipeline answers."""
    monkeypatch.setenv(RING_JOIN_TIMEOUT_VARIABLE, "8")
    leader_shard, follower_shard = pipeline_of((3, 1))
    leader, follower = rank_supervisor(endless_deep, leader_shard), rank_supervisor(endless_deep, follower_shard)
    async with anyio.create_task_group() as group:
        group.start_soon(follower.run)
        with anyio.fail_after(120):
            while follower.waited_for_ring < 1:
                await anyio.sleep(0.2)
        assert not follower.gave_up
        assert "had not joined its ring" in (follower.last_error or "")
        group.start_soon(leader.run)
        try:
            with anyio.fail_after(240):
                await until_ready(leader)
                await until_ready(follower)
            await _assert_serves(leader)
            assert not follower.gave_up
        finally:
            async with anyio.create_task_group() as stopping:
                stopping.start_soon(leader.stop)
                stopping.start_soon(follower.stop)
            group.cancel_scope.cancel()
