"""Pipelines of real runner processes on 127.0.0.1 (one supervisor per rank), and tasks to compare them with."""

from collections.abc import AsyncGenerator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import anyio

from exo.shared.types.chunks import Chunk, PrefillProgressChunk, ToolCallChunk
from exo.shared.types.common import ModelId, new_command_id, new_runner_id, new_task_id
from exo.shared.types.cpu_kernels import CpuWeightsSetting
from exo.shared.types.tasks import (
    GenerationParams,
    GenerationTask,
    PromptMessage,
    SamplingParams,
    StructuredOutput,
    ToolPolicy,
)
from exo.shared.types.tool_spec import ToolSpec
from exo.shared.types.worker.shards import ShardAssignment, pipeline_shards
from exo.worker.runner.runner_config import RunnerConfig
from exo.worker.runner.supervisor import RunnerSupervisor
from tests.fixtures.fixture_specs import GET_WEATHER_TOOL
from tests.worker.engines.mlx.distributed.ranks import local_peers
from tests.worker.runner.tasks import collect, until_ready

DEEP_MODEL = ModelId("tiny-qwen-tools-deep")
WEATHER = ToolSpec.model_validate(GET_WEATHER_TOOL["function"])
PREFIX_CACHE_BYTES = 64 * 1024 * 1024


def task(
    content: str,
    *,
    tool_policy: ToolPolicy | None = None,
    sampling: SamplingParams | None = None,
    structured_output: StructuredOutput | None = None,
) -> GenerationTask:
    return GenerationTask(
        task_id=new_task_id(),
        command_id=new_command_id(),
        model_id=DEEP_MODEL,
        params=GenerationParams(
            messages=(PromptMessage(role="user", content=content),),
            tool_policy=tool_policy or ToolPolicy(),
            sampling=sampling or SamplingParams(max_tokens=64),
            structured_output=structured_output,
        ),
    )


def comparable(chunks: Sequence[Chunk]) -> list[Chunk]:
    """Chunks with the random tool-call ids made equal, so two runs of the same task compare, and only the start and
    end of the prefill progress (a whole-model runner also reports between its pieces, which are sized by time)."""
    kept = [
        chunk
        for chunk in chunks
        if not isinstance(chunk, PrefillProgressChunk)
        or chunk.done_tokens in (chunk.cached_tokens, chunk.prompt_tokens)
    ]
    return [
        chunk.model_copy(update={"call_id": f"call_{position}"}) if isinstance(chunk, ToolCallChunk) else chunk
        for position, chunk in enumerate(kept)
    ]


async def run_task(supervisor: RunnerSupervisor, chat: GenerationTask) -> list[Chunk]:
    return await collect(supervisor.submit(chat))


@asynccontextmanager
async def running_ranks(
    model_path: Path,
    shards: Sequence[ShardAssignment],
    *,
    ready_within: float = 300,
    cpu_weights: CpuWeightsSetting = "float32",
) -> AsyncGenerator[list[RunnerSupervisor]]:
    """One supervisor (and runner process) per shard, all ready, each holding weights as `cpu_weights`; stopped on
    exit."""
    supervisors = [rank_supervisor(model_path, shard, cpu_weights) for shard in shards]
    async with anyio.create_task_group() as group:
        for supervisor in supervisors:
            group.start_soon(supervisor.run)
        with anyio.fail_after(ready_within):
            for supervisor in supervisors:
                await until_ready(supervisor)
        try:
            yield supervisors
        finally:
            # All at once: a rank stopped alone would see the others leave and be restarted meanwhile.
            async with anyio.create_task_group() as stopping:
                for supervisor in supervisors:
                    stopping.start_soon(supervisor.stop)
            group.cancel_scope.cancel()


def rank_supervisor(
    model_path: Path, shard: ShardAssignment, cpu_weights: CpuWeightsSetting = "float32"
) -> RunnerSupervisor:
    """A supervisor (not started) of one rank's runner, as `running_ranks` makes them."""
    config = RunnerConfig(
        model_id=DEEP_MODEL,
        model_path=model_path,
        shard=shard,
        prefix_cache_bytes=PREFIX_CACHE_BYTES,
        cpu_weights=cpu_weights,
    )
    return RunnerSupervisor(new_runner_id(), config)


def pipeline_of(layer_counts: Sequence[int]) -> list[ShardAssignment]:
    return list(pipeline_shards(local_peers(layer_counts)))


def tensor_split_of(world_size: int, num_layers: int) -> list[ShardAssignment]:
    """The shards of a tensor split: every rank runs all `num_layers` layers with 1/`world_size` of their heads."""
    return list(pipeline_shards(local_peers([num_layers] * world_size, parallel="tensor")))
