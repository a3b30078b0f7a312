"""Measure the "keep the ring busy" lever on its own: a 2-rank split decoding a batch of rows as one micro-batch (the
ranks take turns, as exo's pipeline batch does) or as two alternating ones (each rank works on one while the other
is in flight), forward passes only (`bench.overlap_worker`), in a pipeline runner's environment and again with the
BLAS's idle threads spinning (`exo.worker.engines.mlx.cpu.rank_threads`).

Run alone with `uv run python -m bench.pipeline_overlap [MODEL_DIR]`; section 8 runs it after its node counts.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.overlap_worker import OverlapReport, OverlapSetup
from bench.results import OverlapMeasurement, OverlapRun
from bench.servers import free_port
from exo.models.paths import default_models_dir
from exo.models.resolve import resolve_model
from exo.shared.types.worker.shards import PipelinePeers
from exo.worker.engines.mlx.cpu.blas import blas_environment
from exo.worker.engines.mlx.cpu.rank_threads import BLOCKTIME_VARIABLE, idle_threads_sleep

CONFIGURATIONS = ((1, 1), (4, 1), (4, 2), (8, 1), (8, 2))
"""(rows, micro-batches) measured in turn, in the same two processes."""
TIMEOUT_S = 300.0


def _layer_counts(model_path: Path) -> tuple[int, int]:
    """An even split of the model's layers (rank 0 takes the odd one), as placement splits equal nodes."""
    config: dict[str, object] = json.loads((model_path / "config.json").read_text())
    layers = config["num_hidden_layers"]
    if not isinstance(layers, int):
        raise TypeError(f"{model_path}/config.json has no integer num_hidden_layers")
    return (layers - layers // 2, layers // 2)


def measure_overlap(model_path: Path, steps: int, warmup_steps: int = 4) -> OverlapMeasurement:
    """Each configuration's greedy decode tok/s over `steps` steps on two fresh rank processes, first in a pipeline
    runner's environment (idle BLAS threads sleep), then with the threads spinning as they do by default."""
    runs = [
        *_measure_pair(model_path, steps, warmup_steps, threads_sleep=True),
        *_measure_pair(model_path, steps, warmup_steps, threads_sleep=False),
    ]
    return OverlapMeasurement(runs=runs, steps=steps, load_average=os.getloadavg())


def _measure_pair(model_path: Path, steps: int, warmup_steps: int, *, threads_sleep: bool) -> list[OverlapRun]:
    peers = PipelinePeers(
        ring_addresses=(f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"),
        task_address=f"127.0.0.1:{free_port()}",
        layer_counts=_layer_counts(model_path),
    )
    environment = blas_environment(os.environ)
    environment.pop(BLOCKTIME_VARIABLE, None)
    if threads_sleep:
        idle_threads_sleep(environment)  # as a pipeline rank's runner does
    processes: list[subprocess.Popen[str]] = []
    try:
        for rank in (0, 1):
            setup = OverlapSetup(
                model_path=model_path,
                rank=rank,
                peers=peers,
                configurations=list(CONFIGURATIONS),
                steps=steps,
                warmup_steps=warmup_steps,
            )
            processes.append(
                subprocess.Popen(
                    [sys.executable, "-m", "bench.overlap_worker", setup.model_dump_json()],
                    env=environment,
                    stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                    text=True,
                )
            )
        output, _ = processes[0].communicate(timeout=TIMEOUT_S)
        processes[1].wait(timeout=60)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    reports = [line for line in output.splitlines() if line.startswith("{")]
    if processes[0].returncode != 0 or not reports:
        raise RuntimeError(f"the overlap measurement's rank 0 exited with {processes[0].returncode} and no report")
    runs = OverlapReport.model_validate_json(reports[-1]).runs
    return [run.model_copy(update={"threads_sleep": threads_sleep}) for run in runs]


if __name__ == "__main__":
    spec = sys.argv[1] if len(sys.argv) > 1 else None
    measured = measure_overlap(resolve_model(spec, default_models_dir()).path, steps=24)
    for run in measured.runs:
        threads = "sleep" if run.threads_sleep else "spin"
        print(f"{run.rows} rows in {run.micro_batches} micro-batch(es), idle threads {threads}: {run.tokens_per_s:.2f}")
    print(f"load average {measured.load_average}")
