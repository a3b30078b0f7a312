"""What the numbers were measured on: platform, CPUs, load, library versions and the BLAS in use."""

import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import NamedTuple

from bench.results import MachineInfo, SectionRun
from exo.worker.engines.mlx.cpu.blas import NO_PRELOAD_VARIABLE, blas_environment, choose_blas


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


SIMD_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")
"""The CPU features that decide which kernels MKL and ggml run (int8 products above all)."""


def cpu_flags() -> str:
    """Which of `SIMD_FLAGS` the processor has (`/proc/cpuinfo` on Linux)."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        return "unknown"
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            present = set(line.split(":", 1)[1].split())
            return " ".join(flag for flag in SIMD_FLAGS if flag in present) or "none of " + ", ".join(SIMD_FLAGS)
    return "unknown"


START_COMMIT_VARIABLE = "EXO_BENCH_START_COMMIT"
"""Where `record_start_commit` keeps the run's commit, for this process and the workers it starts."""
UNCOMMITTED = " (with uncommitted changes)"
REPOSITORY = Path(__file__).resolve().parents[1]


def checkout_commit() -> str:
    """The checkout's short commit id, with UNCOMMITTED appended when tracked files differ from it; "unknown"
    outside a git checkout."""
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPOSITORY, capture_output=True, text=True, check=False
    ).stdout.strip()
    if not head:
        return "unknown"
    changes = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return head + (UNCOMMITTED if changes else "")


def record_start_commit() -> str:
    """Fix the run's commit as the checkout stands now, when the run starts: a checkout rebased or edited while a
    run measures (hours, some of them) must not lend its commit to numbers measured on another's code. Every later
    `exo_commit` here, and in the workers this process starts (they inherit the environment), reports it."""
    return os.environ.setdefault(START_COMMIT_VARIABLE, checkout_commit())


def exo_commit() -> str:
    """The commit the run started from (`record_start_commit`), else the checkout's now."""
    return os.environ.get(START_COMMIT_VARIABLE) or checkout_commit()


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
    """The run that just measured a section: the commit it started from, the CPU, the load now and the command."""
    return SectionRun(
        exo_commit=exo_commit(),
        cpu=f"{os.cpu_count() or 0} × {cpu_model()}",
        load_average=os.getloadavg(),
        command=" ".join([program, *arguments]),
        finished_utc=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    )


class WorkerRun(NamedTuple):
    stdout: str
    header: str
    """The run's provenance line for the report: commit, machine, load at the start and the end, time, command."""


def run_bench_worker(module: str) -> WorkerRun:
    """Run `python -m <module> --worker` with this process's arguments in a child that has the runner's BLAS
    environment (as the engine's runner would); exits with the child's status when it fails."""
    load_start = os.getloadavg()
    command = [sys.executable, "-m", module, "--worker", *sys.argv[1:]]
    done = subprocess.run(command, env=blas_environment(os.environ), stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"worker failed (exit {done.returncode})")
    loads = [", ".join(f"{value:.2f}" for value in load) for load in (load_start, os.getloadavg())]
    header = (
        f"Run: commit {checkout_commit()}, {os.cpu_count()} × {cpu_model()} ({cpu_flags()}); load average "
        f"(1, 5, 15 min) {loads[0]} at the start, {loads[1]} at the end "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}); "
        f"command `uv run python -m {module} {' '.join(sys.argv[1:])}`.\n"
    )
    return WorkerRun(done.stdout, header)
