"""Parent side of the constrained-decoding section: run `bench.constrained_worker` with exo's runner environment."""

import os
from pathlib import Path

from bench.constrained_worker import ConstrainedSetup
from bench.results import ConstrainedReport, ConstrainedSettings
from bench.worker_process import run_worker
from exo.worker.engines.mlx.cpu.blas import blas_environment

OPENCODE_TOOLS = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "opencode" / "tools.json"
"""The ten tools opencode offers, as captured from its requests."""
WORKER_TIMEOUT_S = 1800.0


def measure_constrained(model_path: Path, settings: ConstrainedSettings) -> ConstrainedReport:
    """Load `model_path` in a fresh worker and measure grammar compile times and constrained decode speed.

    A fresh process makes the first grammar compile really the first; its stderr goes to the bench's stderr.
    """
    setup = ConstrainedSetup(model_path=model_path, tools_path=OPENCODE_TOOLS, settings=settings)
    report = run_worker(
        "bench.constrained_worker",
        setup.model_dump_json(),
        blas_environment(os.environ),
        WORKER_TIMEOUT_S,
        "constrained-decoding",
    )
    return ConstrainedReport.model_validate_json(report)
