"""A runner reports its memory to its supervisor (`RunnerMemoryReport`), which keeps it for /state and /metrics
beside the resident size it measures itself: on a real runner, the prefix cache's snapshot shows as queued when the
task ends and as written to disk once the runner turns idle, mlx's freed buffers are emptied at that turn, and a
stopped runner has no resident size."""

from pathlib import Path

import anyio

from exo.shared.types.common import new_command_id, new_task_id
from exo.shared.types.tasks import GenerationParams, GenerationTask, PromptMessage, SamplingParams
from exo.shared.types.worker.runner_response import RunnerMemory
from exo.worker.runner.runner_config import RunnerConfig
from exo.worker.runner.supervisor import RunnerSupervisor
from tests.exo_server import fixture_model
from tests.worker.runner.pipelines import DEEP_MODEL, pipeline_of, run_task, running_ranks, task
from tests.worker.runner.tasks import MODEL, collect, running_supervisor

SYSTEM_PROMPT = "You are a careful coding agent. Follow the rules of the repository. " * 30
"""Long enough (over 256 tokens) for the prefix cache to keep a disk snapshot of it."""


def _session_task() -> GenerationTask:
    messages = (PromptMessage(role="system", content=SYSTEM_PROMPT), PromptMessage(role="user", content="Hello!"))
    return GenerationTask(
        task_id=new_task_id(),
        command_id=new_command_id(),
        model_id=MODEL,
        params=GenerationParams(messages=messages, sampling=SamplingParams(max_tokens=8)),
    )


def _config(cache_dir: Path) -> RunnerConfig:
    """A runner with a memory and a disk prefix cache."""
    return RunnerConfig(
        model_id=MODEL,
        model_path=fixture_model(MODEL),
        prefix_cache_bytes=1 << 28,
        prefix_cache_dir=cache_dir,
        prefix_cache_disk_bytes=1 << 30,
    )


async def test_a_runner_reports_its_memory_as_a_task_ends_and_again_once_idle(tmp_path: Path) -> None:
    reports: list[RunnerMemory] = []

    def record(supervisor: RunnerSupervisor) -> None:
        """Every new memory report the supervisor receives, in order."""
        if supervisor.memory is not None and (not reports or reports[-1] is not supervisor.memory):
            reports.append(supervisor.memory)

    async with running_supervisor(config=_config(tmp_path), on_change=record) as supervisor:
        with anyio.fail_after(30):  # the runner turns idle right after loading, and reports then
            while not reports:
                await anyio.sleep(0.05)
        loaded = reports[-1]
        assert loaded.prefix_cache is not None
        assert (loaded.prefix_cache.memory_entries, loaded.prefix_cache.disk_entries) == (0, 0)
        assert loaded.mlx_active_bytes > 0  # the weights mlx holds
        resident = supervisor.resident_bytes
        assert resident is not None
        assert resident > loaded.mlx_active_bytes

        await collect(supervisor.submit(_session_task()))
        with anyio.fail_after(60):  # the snapshot is written once the runner is idle, after the answer went out
            while (usage := reports[-1].prefix_cache) is None or usage.disk_entries == 0:
                await anyio.sleep(0.05)

        after_task = reports[1:]
        ended = after_task[0].prefix_cache
        assert ended is not None
        assert ended.memory_entries == 1
        assert ended.memory_bytes > 0
        assert ended.queued_bytes > 0
        assert ended.disk_entries == 0
        idle = after_task[-1]
        assert idle.prefix_cache is not None
        assert idle.prefix_cache.queued_bytes == 0
        assert idle.prefix_cache.disk_entries == 1
        assert idle.prefix_cache.disk_bytes > 0
        assert idle.prefix_cache.memory_bytes == ended.memory_bytes  # the memory tier keeps it too
        assert idle.mlx_cache_bytes == 0  # freed buffers are emptied as the runner turns idle
    assert supervisor.resident_bytes is None


async def test_every_rank_of_a_pipeline_reports_its_memory_and_its_part_of_the_prefix_cache() -> None:
    async with running_ranks(fixture_model(DEEP_MODEL), pipeline_of([2, 2])) as supervisors:
        await run_task(supervisors[0], task("Hello!"))
        with anyio.fail_after(30):  # each rank reports as the task leaves it and as it turns idle
            while any(_cached_entries(supervisor) != 1 for supervisor in supervisors):
                await anyio.sleep(0.05)
        for supervisor in supervisors:
            memory = supervisor.memory
            assert memory is not None
            assert memory.mlx_active_bytes > 0
            assert memory.prefix_cache is not None
            assert memory.prefix_cache.memory_bytes > 0
            assert supervisor.resident_bytes is not None


def _cached_entries(supervisor: RunnerSupervisor) -> int | None:
    memory = supervisor.memory
    return memory.prefix_cache.memory_entries if memory is not None and memory.prefix_cache is not None else None
