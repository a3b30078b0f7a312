"""What the numbers were measured on: platform, CPUs, load, library versions and the BLAS in use."""

import os
import platform
import subprocess
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from bench.results import MachineInfo, SectionRun
from exo.worker.engines.mlx.cpu.blas import NO_PRELOAD_VARIABLE, choose_blas


def blas_description() -> str:
    """The BLAS exo preloads for its runner (and the bench for its baselines), or why there is none."""
    if os.environ.get(NO_PRELOAD_VARIABLE) == "1":
        return f"mlx's bundled reference BLAS ({NO_PRELOAD_VARIABLE}=1)"
    choice = choose_blas(os.environ)
    if choice is None:
        return "mlx's bundled reference BLAS (no optimized BLAS found)" if platform.system() == "Linux" else "native"
    threading = f", {choice.threading} threads" if choice.threading else ""
    return f"{choice.kind} from {choice.source}: {choice.library} (LD_PRELOAD{threading})"


def cpu_model() -> str:
    """The processor's name (`/proc/cpuinfo` on Linux): the same BLAS behaves differently on different CPUs."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def exo_commit() -> str:
    """The checkout's short commit id, or "unknown" outside a git checkout."""
    completed = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    return completed.stdout.strip() or "unknown"


def machine_info(matmul_gflops: float) -> MachineInfo:
    """Describe this machine; `matmul_gflops` comes from the baseline subprocess, where the BLAS preload applies."""
    load_1, load_5, load_15 = os.getloadavg()
    return MachineInfo(
        platform=platform.platform(),
        python=platform.python_version(),
        cpu_count=os.cpu_count() or 0,
        cpu_model=cpu_model(),
        load_average=(load_1, load_5, load_15),
        mlx_version=metadata.version("mlx"),
        mlx_lm_version=metadata.version("mlx-lm"),
        blas=blas_description(),
        matmul_gflops=matmul_gflops,
        exo_commit=exo_commit(),
    )


def section_run(arguments: Sequence[str], program: str = "uv run python -m bench") -> SectionRun:
    """The run that just measured a section: this checkout's commit, the CPU, the load now and the command."""
    return SectionRun(
        exo_commit=exo_commit(),
        cpu=f"{os.cpu_count() or 0} × {cpu_model()}",
        load_average=os.getloadavg(),
        command=" ".join([program, *arguments]),
        finished_utc=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    )
