"""Run a bench worker module in a fresh process and read back its one-line JSON report."""

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence

from exo.worker.engines.mlx.cpu.blas import blas_environment

_PRELOADED_MARKER = "EXO_BENCH_RUNNER_BLAS"


def with_runners_blas(module: str, arguments: Sequence[str], extra: Mapping[str, str] | None = None) -> None:
    """Run `python -m module arguments` again in this process with exo's runner environment (its BLAS preloaded,
    which must happen before mlx is imported), unless this already is that run; `extra` variables are added."""
    if os.environ.get(_PRELOADED_MARKER) == "1":
        return
    environment = {**blas_environment(os.environ), **(extra or {}), _PRELOADED_MARKER: "1"}
    os.execve(sys.executable, [sys.executable, "-m", module, *arguments], environment)


def run_worker(module: str, setup_json: str, environment: Mapping[str, str], timeout_s: float, what: str) -> str:
    """`python -m module setup_json` with `environment`; returns the last stdout line that is a JSON object.

    Libraries may print to stdout too, hence the last such line. The worker's stderr goes to the bench's stderr.
    subprocess.run kills the worker if this process is interrupted (the bench turns SIGTERM into SystemExit).
    """
    completed = subprocess.run(
        [sys.executable, "-m", module, setup_json],
        env=dict(environment),
        stdout=subprocess.PIPE,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    reports = [line for line in completed.stdout.splitlines() if line.startswith("{")]
    if completed.returncode != 0 or not reports:
        raise RuntimeError(f"the {what} worker exited with {completed.returncode} and no report")
    return reports[-1]
