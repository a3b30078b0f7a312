"""Parent side of the speculation section: run `bench.speculation_worker` with exo's runner environment."""

import os
from pathlib import Path

from bench.constrained import OPENCODE_TOOLS
from bench.results import SpeculationReport, SpeculationSettings
from bench.speculation_worker import SpeculationSetup
from bench.worker_process import run_worker
from exo.worker.engines.mlx.cpu.blas import blas_environment

WORKER_TIMEOUT_S = 3600.0


def measure_speculation(model_path: Path, settings: SpeculationSettings) -> SpeculationReport:
    """Load `model_path` in a fresh worker and time decoding with speculation off and on, modes taking turns."""
    setup = SpeculationSetup(model_path=model_path, tools_path=OPENCODE_TOOLS, settings=settings)
    report = run_worker(
        "bench.speculation_worker",
        setup.model_dump_json(),
        blas_environment(os.environ),
        WORKER_TIMEOUT_S,
        "speculation",
    )
    return SpeculationReport.model_validate_json(report)
