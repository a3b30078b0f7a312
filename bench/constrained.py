"""Parent side of the constrained-decoding section: run `bench.constrained_worker` with exo's runner environment."""

import os
import subprocess
import sys
from pathlib import Path

from bench.constrained_worker import ConstrainedSetup
from bench.results import ConstrainedReport, ConstrainedSettings
from exo.worker.engines.mlx.blas import blas_environment

OPENCODE_TOOLS = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "opencode" / "tools.json"
"""The ten tools opencode offers, as captured from its requests."""
WORKER_TIMEOUT_S = 1800.0


def measure_constrained(model_path: Path, settings: ConstrainedSettings) -> ConstrainedReport:
    """Load `model_path` in a fresh worker and measure grammar compile times and constrained decode speed.

    A fresh process makes the first grammar compile really the first; its stderr goes to the bench's stderr.
    """
    setup = ConstrainedSetup(model_path=model_path, tools_path=OPENCODE_TOOLS, settings=settings)
    # subprocess.run kills the worker if this process is interrupted (the bench turns SIGTERM into SystemExit).
    completed = subprocess.run(
        [sys.executable, "-m", "bench.constrained_worker", setup.model_dump_json()],
        env=blas_environment(os.environ),
        stdout=subprocess.PIPE,
        text=True,
        timeout=WORKER_TIMEOUT_S,
        check=False,
    )
    # Libraries may print to stdout too: the report is the last line that is a JSON object.
    reports = [line for line in completed.stdout.splitlines() if line.startswith("{")]
    if completed.returncode != 0 or not reports:
        raise RuntimeError(f"the constrained-decoding worker exited with {completed.returncode} and no report")
    return ConstrainedReport.model_validate_json(reports[-1])
