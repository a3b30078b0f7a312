"""Run a bench worker module in a fresh process and read back its one-line JSON report."""

import subprocess
import sys
from collections.abc import Mapping


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
