"""Parent side of the raw mlx-lm baselines: start `bench.raw_worker` (mlx-lm with exo's replacements) or
`bench.stock_worker` (stock mlx-lm, no exo engine module) with exo's runner BLAS environment and talk to them."""

import os
import subprocess
import sys
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from bench.raw_protocol import PassCostRequest, PassCosts, RawReady, RawRequest, RawSetup
from bench.results import StreamMeasurement
from exo.worker.engines.mlx.cpu.blas import blas_environment

STOP_TIMEOUT_S = 20.0


class RawBaseline:
    """A running raw worker: `measure` runs one greedy generation of the decode prompt in it."""

    def __init__(self, process: subprocess.Popen[str], ready: RawReady) -> None:
        self._process = process
        self.ready = ready

    def measure(self, tag: str, max_tokens: int) -> StreamMeasurement:
        """Generate up to `max_tokens` for the decode prompt tagged `tag`; blocks until done."""
        _write_line(self._process.stdin, RawRequest(tag=tag, max_tokens=max_tokens).model_dump_json())
        return StreamMeasurement.model_validate_json(_read_line(self._process))

    def pass_costs(self, rows: list[int], repeats: int, *, planned: bool = False) -> dict[int, float]:
        """Best seconds of one decode step over each number of sequences in `rows` (bare mlx-lm, no server); with
        `planned`, through exo's matmul plan."""
        request = PassCostRequest(rows=rows, repeats=repeats, planned=planned)
        _write_line(self._process.stdin, request.model_dump_json())
        return PassCosts.model_validate_json(_read_line(self._process)).seconds


def _write_line(stream: IO[str] | None, line: str) -> None:
    if stream is None:
        raise RuntimeError("the raw worker has no stdin")
    stream.write(line + "\n")
    stream.flush()


def _read_line(process: subprocess.Popen[str]) -> str:
    if process.stdout is None:
        raise RuntimeError("the raw worker has no stdout")
    # Libraries may print to stdout too: the worker's answers are the lines that are JSON objects.
    for line in process.stdout:
        if line.startswith("{"):
            return line
    raise RuntimeError(f"the raw worker exited with {process.wait()} (its stderr went to the bench's stderr)")


@contextmanager
def running_raw_baseline(model_path: Path, float32_copy: Path) -> Generator[RawBaseline]:
    """mlx-lm with exo's replacements (it loads the model and writes `float32_copy` first); stopped on exit."""
    with _running("bench.raw_worker", RawSetup(model_path=model_path, float32_copy=float32_copy)) as baseline:
        yield baseline


@contextmanager
def running_stock_baseline(float32_copy: Path) -> Generator[RawBaseline]:
    """Stock mlx-lm on the float32 copy, in a process that never imports exo's engine (refused if it did)."""
    with _running("bench.stock_worker", RawSetup(model_path=float32_copy, float32_copy=float32_copy)) as baseline:
        if baseline.ready.exo_engine_imported:
            raise RuntimeError("the stock mlx-lm worker imported exo's engine: it would not be stock")
        yield baseline


@contextmanager
def _running(module: str, setup: RawSetup) -> Generator[RawBaseline]:
    process = subprocess.Popen(
        [sys.executable, "-m", module, setup.model_dump_json()],
        env=blas_environment(os.environ),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield RawBaseline(process, RawReady.model_validate_json(_read_line(process)))
    finally:
        if process.stdin is not None:
            process.stdin.close()  # the worker's request loop ends when stdin closes
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
