"""`uv run python -m bench.quant_kernels [--rows 1,4,8,512] [--shapes ...] [--json PATH]`: candidate kernels for
quantized weights on a CPU (issue 33), side by side on the default model's matrix shapes.

Each candidate computes y = x · Wᵀ for W (out × in) and x (rows × in). Candidates: float32 `mx.matmul` with the BLAS
exo's runner preloads (MKL from the `mkl` wheel: what exo runs now); MKL's integer GEMM `cblas_gemm_s8u8s32` (int8
weights with per-row scales, activations quantized per row when the product runs, plain and MKL-packed); mlx's
own `quantized_matmul` (4- and 8-bit, group 64, float32 scales); ggml's `ggml_mul_mat` on GGUF block types
(Q4_0, Q4_K, Q6_K, Q8_0) from the llama.cpp build (`bench.llama_cpp_build`), when it exists; and, on the same
blocks, exo's multi-row kernel (`exo rows`, from `exo ggml build`) where it takes the type and row count; Q4_K
also held in ggml's interleaved layout (`repacked`), as llama.cpp and the engine hold it, by ggml and by exo's kernel;
Q6_K also packed into exo's kernel's own layout (`packed`), as the engine holds it.

Per product: the median time (quantizing the activations included where a kernel needs it), the effective GB/s of
weight bytes read (the candidate's weight bytes over that time) and the largest error against the float32 product
(max |y − y₃₂| / max |y₃₂|). Weights and activations are seeded Gaussian values (no model needed). Prints Markdown
with commit, CPU, load and command; the measurement is not a test.
"""

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from bench.worker_process import with_runners_blas

DEFAULT_SHAPES = ("896x896", "896x4864", "4864x896", "128x896", "151936x896")
"""(out × in) of the default model's products: q/o projections, down, gate/up, k/v, and the output matrix."""
DEFAULT_ROWS = (1, 4, 8, 512)
MIN_SECONDS = 0.3
"""Each candidate repeats until it has run this long (at least `MIN_REPEATS` times)."""
MIN_REPEATS = 3
MAX_REPEATS = 50
SLOW_CALL_SECONDS = 2.0
GGML_TYPES = ("Q4_0", "Q5_0", "Q8_0", "Q4_K", "Q6_K")
"""Measured where their blocks divide the rows (K-quants: 256 values, so not the 896-wide rows)."""
DEFAULT_THREADS = 2


class KernelResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    candidate: str
    out_features: int
    in_features: int
    rows: int
    seconds: float
    """Median over `repeats` timed calls."""
    repeats: int
    weight_bytes: int
    """The format's bytes per product: values and scales as the kernel reads them (GB/s is computed from these)."""
    stored_bytes: int
    """What the candidate holds in memory for W (larger than `weight_bytes` for MKL's packed copy)."""
    max_relative_error: float

    @property
    def gigabytes_per_s(self) -> float:
        return self.weight_bytes / self.seconds / 1e9


class KernelReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    results: list[KernelResult]
    unavailable: dict[str, str]
    """Candidates not measured, and why."""
    commit: str
    cpu: str
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    command: str
    finished_utc: str
    blas: str
    threads: int
    """Threads each candidate ran on (MKL's, and ggml's pool; mlx's own quantized kernels use one)."""


def parse_shape(text: str) -> tuple[int, int]:
    """`OUTxIN` as two positive integers."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(part.isdigit() and int(part) > 0 for part in parts):
        raise argparse.ArgumentTypeError(f"a shape is OUTxIN, such as 896x4864, not {text!r}")
    return int(parts[0]), int(parts[1])


def parse_rows(text: str) -> list[int]:
    try:
        rows = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"rows are comma-separated positive integers, not {text!r}") from None
    if not rows or any(row <= 0 for row in rows):
        raise argparse.ArgumentTypeError(f"rows are comma-separated positive integers, not {text!r}")
    return rows


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.quant_kernels", description=__doc__)
    parser.add_argument("--rows", type=parse_rows, default=list(DEFAULT_ROWS), help="activation row counts")
    parser.add_argument(
        "--shapes", type=parse_shape, nargs="+", default=[parse_shape(shape) for shape in DEFAULT_SHAPES]
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=DEFAULT_THREADS,
        help="threads for MKL and ggml (default 2, as llama-server -t 2); 1 ranks kernels more steadily under load",
    )
    parser.add_argument("--json", type=Path, help="also save the results as JSON here")
    parser.add_argument("--llama-cpp-root", type=Path, help="the llama.cpp build cache (default build/llama-cpp)")
    return parser


def time_call(call: Callable[[], object]) -> tuple[float, int]:
    """Median seconds of `call` after one warm-up, and how many timed calls it took. A warm-up slower than
    `SLOW_CALL_SECONDS` is the one timing: at that size its one-time costs are noise, and repeating it costs minutes
    (mlx's quantized kernels over 512 rows of the output matrix)."""
    begin = time.perf_counter()
    call()
    warm_up = time.perf_counter() - begin
    if warm_up > SLOW_CALL_SECONDS:
        return warm_up, 1
    timings: list[float] = []
    started = time.perf_counter()
    while True:
        begin = time.perf_counter()
        call()
        timings.append(time.perf_counter() - begin)
        elapsed = time.perf_counter() - started
        if len(timings) >= MAX_REPEATS or (len(timings) >= MIN_REPEATS and elapsed >= MIN_SECONDS):
            break
    return statistics.median(timings), len(timings)


def main(argv: Sequence[str] | None = None) -> None:
    command = list(sys.argv[1:] if argv is None else argv)
    arguments = build_parser().parse_args(command)
    threads = str(arguments.threads)
    with_runners_blas("bench.quant_kernels", command, {"MKL_NUM_THREADS": threads, "OMP_NUM_THREADS": threads})
    from bench.quant_kernels_measure import measure

    report = measure(arguments.shapes, arguments.rows, command, arguments.llama_cpp_root, arguments.threads)
    if arguments.json is not None:
        arguments.json.write_text(report.model_dump_json(indent=2))
    from bench.report_quant_kernels import render_kernels

    print("\n".join(render_kernels(report)))


if __name__ == "__main__":
    main()
