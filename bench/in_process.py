"""What the in-process benches share: the model as exo's runner loads it, and the lines naming a run."""

import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from bench.machine import section_run
from bench.markdown import without_directories

if TYPE_CHECKING:
    from exo.worker.engines.mlx.loaded_model import LoadedModel


def load_as_the_runner_does(model_spec: str | None) -> "LoadedModel":
    """`model_spec` (as `exo --model` takes it; None: exo's default model) loaded as exo's runner loads it: on a Linux
    CPU float32, the CPU kernels on and the matmul plan made (run under `with_runners_blas` for the runner's BLAS)."""
    from exo.models.paths import default_models_dir
    from exo.models.resolve import resolve_model
    from exo.shared.types.worker.shards import ShardAssignment
    from exo.worker.engines.mlx.cpu.engine import CpuKernels
    from exo.worker.engines.mlx.cpu.matmul_planner import MatmulPlanner
    from exo.worker.engines.mlx.model_loader import load_model

    kernels = CpuKernels()
    loaded = load_model(resolve_model(model_spec, default_models_dir()).path, ShardAssignment(), cpu_kernels=kernels)
    if kernels.allow_matmul_plan(True, loaded.dtype):
        MatmulPlanner.for_loaded(loaded)
    return loaded


def print_run_header(title: str, command: Sequence[str], module: str, load_before: tuple[float, float, float]) -> None:
    """The run's title, then its commit, CPU, time, load average at the start and now, and command."""
    run = section_run(command, program=f"uv run python -m {module}")
    load_after = os.getloadavg()
    print(title)
    print(f"commit {run.exo_commit}, {run.cpu}, {run.finished_utc}")
    print(
        "load average (1, 5, 15 min) "
        f"{', '.join(f'{value:.2f}' for value in load_before)} at the start, "
        f"{', '.join(f'{value:.2f}' for value in load_after)} at the end"
    )
    print(f"command `{without_directories(run.command)}`\n")
    sys.stdout.flush()
