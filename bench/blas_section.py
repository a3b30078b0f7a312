"""Section 6: which BLAS to put in front of mlx on Linux x86_64, measured rather than assumed.

Candidates: mlx's bundled reference BLAS, the PyPI MKL with each threading layer, every system BLAS that exo's
search finds, and any extra library given on the command line (for example Debian's OpenBLAS unpacked into a
private folder, to compare without installing it). Each run is a fresh process (`bench.blas_worker`) with the
candidate preloaded; candidates take turns round by round so changing load falls on all of them alike, and each
is also measured while one busy-looping process competes for a core.
"""

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.blas_worker import BlasWorkerSetup
from bench.machine import cpu_model, exo_commit
from bench.results import BlasMeasurement, BlasRow, BlasSection
from bench.worker_process import run_worker
from exo.worker.engines.mlx.cpu.blas import (
    LIBRARY_DIRS,
    NO_PRELOAD_VARIABLE,
    SYSTEM_LIBRARIES,
    choose_blas,
    find_pypi_mkl,
)

WORKER_TIMEOUT_S = 900.0
MKL_LAYERS = ("INTEL", "GNU", "TBB", "SEQUENTIAL")


@dataclass(frozen=True)
class BlasCandidate:
    name: str
    environment: dict[str, str] = field(default_factory=dict[str, str])
    chosen_by_exo: bool = False


def _is_exo_choice(library: Path, threading: str | None) -> bool:
    choice = choose_blas(os.environ)
    return choice is not None and choice.library.resolve() == library.resolve() and choice.threading == threading


def find_candidates(extra_libraries: Sequence[Path], extra_library_path: str | None) -> list[BlasCandidate]:
    """Every BLAS worth measuring on this machine, the reference first."""
    candidates = [BlasCandidate("mlx's bundled reference BLAS", {NO_PRELOAD_VARIABLE: "1"})]
    mkl = find_pypi_mkl()
    if mkl is not None:
        for layer in MKL_LAYERS:
            environment = {"LD_PRELOAD": str(mkl), "MKL_THREADING_LAYER": layer, "MKL_INTERFACE_LAYER": "LP64"}
            if layer == "TBB":  # libmkl_tbb_thread needs libtbb, which sits beside it but is not found otherwise
                environment["LD_LIBRARY_PATH"] = str(mkl.parent)
            candidates.append(BlasCandidate(f"PyPI mkl, {layer} threads", environment, _is_exo_choice(mkl, layer)))
    for directory in LIBRARY_DIRS:
        for kind, name in SYSTEM_LIBRARIES:
            library = directory / name
            if library.is_file():
                chosen = _is_exo_choice(library, None)
                candidates.append(BlasCandidate(f"system {kind}: {library}", {"LD_PRELOAD": str(library)}, chosen))
    for library in extra_libraries:
        environment = {"LD_PRELOAD": str(library)}
        if extra_library_path:
            environment["LD_LIBRARY_PATH"] = extra_library_path
        candidates.append(BlasCandidate(f"given: {library}", environment))
    return candidates


def _run_worker(candidate: BlasCandidate, setup: BlasWorkerSetup) -> BlasMeasurement:
    environment = {key: value for key, value in os.environ.items() if key not in ("LD_PRELOAD", NO_PRELOAD_VARIABLE)}
    report = run_worker(
        "bench.blas_worker",
        setup.model_dump_json(),
        {**environment, **candidate.environment},
        WORKER_TIMEOUT_S,
        f"BLAS ({candidate.name})",
    )
    return BlasMeasurement.model_validate_json(report)


def _contended(candidate: BlasCandidate, setup: BlasWorkerSetup) -> BlasMeasurement:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        return _run_worker(candidate, setup.model_copy(update={"model_path": None}))
    finally:
        busy.kill()
        busy.wait()


def measure_blas(
    model_id: str | None,
    model_path: Path | None,
    rounds: int,
    *,
    extra_libraries: Sequence[Path] = (),
    extra_library_path: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> BlasSection:
    """Measure every candidate `rounds` times in turn, quiet and with one competing busy process."""
    candidates = find_candidates(extra_libraries, extra_library_path)
    setup = BlasWorkerSetup(model_path=model_path, prefill_tokens=128, decode_tokens=16, sustained_seconds=3.0)
    quiet: dict[str, list[BlasMeasurement]] = {candidate.name: [] for candidate in candidates}
    contended: dict[str, list[BlasMeasurement]] = {candidate.name: [] for candidate in candidates}
    for round_number in range(1, rounds + 1):
        for candidate in candidates:
            if progress is not None:
                progress(f"BLAS round {round_number}/{rounds}: {candidate.name}")
            quiet[candidate.name].append(_run_worker(candidate, setup))
            contended[candidate.name].append(_contended(candidate, setup))
    load_1, load_5, load_15 = os.getloadavg()
    return BlasSection(
        rows=[
            BlasRow(
                candidate=candidate.name,
                chosen_by_exo=candidate.chosen_by_exo,
                quiet=quiet[candidate.name],
                contended=contended[candidate.name],
            )
            for candidate in candidates
        ],
        rounds=rounds,
        model_id=model_id,
        prefill_tokens=setup.prefill_tokens,
        decode_tokens=setup.decode_tokens,
        cpu=f"{cpu_model()} ({os.cpu_count()} CPUs)",
        load_average=(load_1, load_5, load_15),
        exo_commit=exo_commit(),
    )
