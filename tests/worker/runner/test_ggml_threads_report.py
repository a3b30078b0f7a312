"""A runner serving ggml weights reports ggml's thread count with each finished task (`TaskDone.ggml_threads`), its
supervisor keeps it for /state and /metrics (`exo_ggml_threads`); a float32 runner reports none. So does every rank
of a pipeline or tensor split: rank 0 with its TaskDones, the others (which end no task of their own) with a
`GgmlThreadsReport` when a task leaves the batch and the count is not the one they sent last.

The ggml runner needs ggml's CPU library (`uv run exo ggml build`, or EXO_GGML_DIR): without it the test skips for a
reason of the machine, a failure under EXO_STRICT_SKIPS=1.
"""

from typing import Literal

import anyio
import pytest

from exo.worker.engines.mlx.cpu.ggml_locate import find_ggml_library, ggml_missing_reason
from exo.worker.runner.runner_config import RunnerConfig
from tests.exo_server import fixture_model
from tests.machine_skips import skip_for_machine
from tests.worker.engines.mlx.cpu.platform_gate import require_linux_cpu
from tests.worker.runner.pipelines import DEEP_MODEL, pipeline_of, run_task, running_ranks, task, tensor_split_of
from tests.worker.runner.tasks import MODEL, chat_task, collect, running_supervisor


async def test_a_ggml_runner_reports_its_thread_count(monkeypatch: pytest.MonkeyPatch) -> None:
    require_linux_cpu()
    if find_ggml_library() is None:
        skip_for_machine(ggml_missing_reason())
    monkeypatch.setenv("EXO_GGML_THREADS", "1")  # the runner subprocess inherits it: a count known in advance
    config = RunnerConfig(model_id=MODEL, model_path=fixture_model(MODEL), cpu_weights="q8_0")
    async with running_supervisor(config=config) as supervisor:
        assert supervisor.ggml_threads is None  # nothing reported before a task ends
        await collect(supervisor.submit(chat_task(max_tokens=4)))
        assert supervisor.ggml_threads == 1


async def test_a_float32_runner_reports_no_ggml_threads() -> None:
    async with running_supervisor() as supervisor:
        await collect(supervisor.submit(chat_task(max_tokens=4)))
        assert supervisor.ggml_threads is None


@pytest.mark.slow
@pytest.mark.parametrize("split", ["layers", "tensor"])
async def test_every_rank_of_a_split_reports_its_thread_count(
    split: Literal["layers", "tensor"], monkeypatch: pytest.MonkeyPatch
) -> None:
    require_linux_cpu()
    if find_ggml_library() is None:
        skip_for_machine(ggml_missing_reason())
    monkeypatch.setenv("EXO_GGML_THREADS", "1")  # every rank's process inherits it
    shards = pipeline_of([2, 2]) if split == "layers" else tensor_split_of(2, 4)
    async with running_ranks(fixture_model(DEEP_MODEL), shards, cpu_weights="q8_0") as supervisors:
        assert [supervisor.ggml_threads for supervisor in supervisors] == [None, None]
        await run_task(supervisors[0], task("Hello!"))
        assert supervisors[0].ggml_threads == 1  # with the TaskDone
        with anyio.fail_after(30):  # rank 1 reports when the task's leave reaches it, after rank 0's TaskDone
            while supervisors[1].ggml_threads is None:
                await anyio.sleep(0.05)
        assert supervisors[1].ggml_threads == 1
