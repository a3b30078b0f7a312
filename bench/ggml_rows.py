"""`uv run python -m bench.ggml_rows`: what one more row costs in ggml's CPU products, by block type (issue 33).

A batched decode step multiplies every weight matrix by one row per sequence. Where a product is bound by reading
the weights, rows after the first come almost free; where each row's dot products cost their own time (arithmetic,
or the weights read again per row), each row costs about as much as the first. This times ggml's product (the
engine's binding, `GgmlMatrix`, on a thread pool of its own, weights in ggml's plain layout, not repacked) over 1, 2,
4 and 8 rows for each block type, on the default model's shapes: an MLP gate (4864 × 896, small enough to stay in
the caches) and the output head (151,936 × 896, 136 MB as Q8_0). Random weights quantized by ggml; every setting
measured in turn, the median of `--repeats` products. Prints Markdown with commit, CPU, load and command. Not a
test. Needs ggml's CPU library (`uv run exo ggml build`).

`uv run python -m bench.ggml_rows [--types Q5_0,Q8_0,Q4_0,Q4_K] [--threads 2] [--repeats 15]`
"""

import argparse
import os
import statistics
import time
from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel

from bench.ggml_kernels import GgmlProduct
from bench.machine import cpu_flags, cpu_model, record_start_commit
from exo.worker.engines.mlx.cpu.ggml_library import Ggml
from exo.worker.engines.mlx.cpu.ggml_locate import find_ggml_library, ggml_missing_reason

SHAPES: tuple[tuple[str, int, int], ...] = (("MLP gate", 4864, 896), ("output head", 151_936, 896))
ROWS: tuple[int, ...] = (1, 2, 4, 8)


class RowsTiming(BaseModel):
    shape: str
    block_type: str
    rows: int
    milliseconds: float

    @property
    def per_row(self) -> float:
        return self.milliseconds / self.rows


def _time(product: GgmlProduct, rows: int, repeats: int, generator: np.random.Generator) -> float:
    x = generator.standard_normal((rows, product.matrix.shape[1]), dtype=np.float32)
    for _ in range(3):
        product.run(x)
    times: list[float] = []
    for _ in range(repeats):
        started = time.perf_counter()
        product.run(x)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def measure(ggml: Ggml, types: Sequence[str], threads: int, repeats: int) -> list[RowsTiming]:
    generator = np.random.default_rng(0)
    timings: list[RowsTiming] = []
    for shape, out_features, in_features in SHAPES:
        weights = generator.standard_normal((out_features, in_features), dtype=np.float32) * 0.05
        for block_type in types:
            if not ggml.fits(block_type, in_features):
                continue  # K-quants take rows of 256-value blocks: 896 is not, hence the GGUF's Q5_0 and Q8_0
            for rows in ROWS:
                product = GgmlProduct.create(ggml, weights, block_type, rows, threads)
                try:
                    milliseconds = _time(product, rows, repeats, generator)
                finally:
                    product.close()
                timings.append(RowsTiming(shape=shape, block_type=block_type, rows=rows, milliseconds=milliseconds))
    return timings


def render(timings: Sequence[RowsTiming]) -> str:
    header = "| Matrix | Block type | " + " | ".join(
        f"{rows} row{'s' if rows > 1 else ''}: ms (per row)" for rows in ROWS
    )
    lines = [header + " | 8 rows ÷ 1 row |", "|---|---|" + "---|" * (len(ROWS) + 1)]
    keys = dict.fromkeys((timing.shape, timing.block_type) for timing in timings)
    for shape, block_type in keys:
        by_rows = {t.rows: t for t in timings if t.shape == shape and t.block_type == block_type}
        cells = [f"{by_rows[rows].milliseconds:.3f} ({by_rows[rows].per_row:.3f})" for rows in ROWS]
        ratio = by_rows[ROWS[-1]].milliseconds / by_rows[ROWS[0]].milliseconds
        lines.append(f"| {shape} | {block_type} | " + " | ".join(cells) + f" | {ratio:.2f}× |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ggml_rows", description=__doc__)
    parser.add_argument("--types", default="Q5_0,Q8_0,Q4_0,Q4_K", help="ggml block types, comma-separated")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    arguments = parser.parse_args(argv)
    folder = find_ggml_library()
    if folder is None:
        print(ggml_missing_reason())
        return 1
    commit = record_start_commit()
    load_before = os.getloadavg()
    timings = measure(Ggml(folder), arguments.types.split(","), arguments.threads, arguments.repeats)
    load_after = os.getloadavg()
    print(
        f"Run: commit {commit}, {os.cpu_count()} × {cpu_model()} ({cpu_flags()}); load average {load_before[0]:.2f} "
        f"at the start, {load_after[0]:.2f} at the end; command `uv run python -m bench.ggml_rows --types "
        f"{arguments.types} --threads {arguments.threads} --repeats {arguments.repeats}`.\n"
    )
    print(render(timings))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
