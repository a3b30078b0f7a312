"""Decode steps over 1 to 8 sequences at 1 and 2 MKL threads, float32 and int8 weights (`--cpu-weights`, issue 33).

MKL's threaded integer GEMM at one row was measured slower than one thread on a loaded Xeon; this times whole
decode steps, to decide whether the int8 products should get a thread count of their own by row count. Both
formats are loaded in one process, the way a runner loads them (exo's `load_model` under `CpuKernels`), with the
BLAS the node preloads; every setting takes its turn in every round, so load from other processes falls on all
alike. A decode step over R rows is one batched step over R sequences (one token each) after a short prompt.

Settings: `1` and `2` set MKL's thread count for every product (int8 only); `default` leaves MKL's own count (the
engine's behaviour; float32 is measured this way only). Prints Markdown with commit, CPU,
load and command. Not a test.

`uv run python -m bench.decode_threads [--model SPEC] [--rounds N] [--steps N] [--rows 1,4,8]`
"""

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel

from bench.machine import checkout_commit, cpu_flags, cpu_model

Setting = Literal["1", "2", "default"]
SETTINGS: tuple[Setting, ...] = ("1", "2", "default")
PROMPT_TOKENS = 64


class Timing(BaseModel):
    weights: str
    setting: Setting
    rows: int
    step_ms: list[float] = []


def _worker(model_spec: str | None, rounds: int, steps: int, row_counts: list[int]) -> None:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from exo.models.paths import default_models_dir
    from exo.models.resolve import resolve_model
    from exo.shared.types.worker.shards import ShardAssignment
    from exo.worker.engines.mlx.cpu import int8_layers
    from exo.worker.engines.mlx.cpu.engine import CpuKernels
    from exo.worker.engines.mlx.model_loader import load_model

    mkl = ctypes.CDLL(str(int8_layers.mkl_int8().library))  # the library already loaded: MKL's one thread setting
    set_threads: Callable[[int], None] = mkl.MKL_Set_Num_Threads
    default_threads = int(mkl.MKL_Get_Max_Threads())
    path = resolve_model(model_spec, default_models_dir()).path
    models = {
        weights: load_model(path, ShardAssignment(), cpu_kernels=CpuKernels("auto", weights=weights)).model
        for weights in ("float32", "int8")
    }
    _progress(f"loaded; MKL's default thread count {default_threads}")
    timings = {
        (weights, setting, rows): Timing(weights=weights, setting=setting, rows=rows)
        for weights in models
        for setting in SETTINGS
        for rows in row_counts
        if setting == "default" or weights == "int8"
    }
    for round_number in range(rounds):
        for key, timing in timings.items():
            weights, setting, rows = key
            set_threads(default_threads if setting == "default" else int(setting))
            model = models[weights]
            cache = make_prompt_cache(model)
            prompt = mx.array(
                [[(row * 7 + index) % 5000 + 100 for index in range(PROMPT_TOKENS)] for row in range(rows)]
            )
            logits = model(prompt, cache=cache)
            mx.eval(logits)
            tokens = logits[:, -1].argmax(-1)[:, None]
            mx.eval(tokens)
            started = time.perf_counter()
            for _ in range(steps):
                logits = model(tokens, cache=cache)
                tokens = logits[:, -1].argmax(-1)[:, None]
                mx.eval(tokens)
            timing.step_ms.append((time.perf_counter() - started) * 1000 / steps)
            _progress(f"round {round_number + 1}: {weights} {setting} rows {rows}: {timing.step_ms[-1]:.1f} ms/step")
    for timing in timings.values():
        print(timing.model_dump_json())


def _progress(line: str) -> None:
    print(f"[bench.decode_threads {time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description="decode steps at 1 and 2 MKL threads, float32 and int8 weights")
    parser.add_argument("--model", default=None, help="a model spec as `exo --model` takes (default: the default)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8, help="decode steps timed per setting and round")
    parser.add_argument("--rows", default="1,4,8", help="comma-separated sequence counts")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    row_counts = [int(value) for value in arguments.rows.split(",")]
    if arguments.worker:
        _worker(arguments.model, arguments.rounds, arguments.steps, row_counts)
        return
    from exo.worker.engines.mlx.cpu.blas import blas_environment

    load_start = os.getloadavg()
    command = [sys.executable, "-m", "bench.decode_threads", "--worker", *sys.argv[1:]]
    done = subprocess.run(command, env=blas_environment(os.environ), stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"worker failed (exit {done.returncode})")
    timings = [Timing.model_validate_json(line) for line in done.stdout.strip().splitlines() if line.startswith("{")]
    load_end = os.getloadavg()
    loads = [", ".join(f"{value:.2f}" for value in load) for load in (load_start, load_end)]
    print(
        f"Run: commit {checkout_commit()}, {os.cpu_count()} × {cpu_model()} ({cpu_flags()}); load average "
        f"(1, 5, 15 min) {loads[0]} at the start, {loads[1]} at the end "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}); command "
        f"`uv run python -m bench.decode_threads {' '.join(sys.argv[1:])}`.\n"
    )
    print("| weights | MKL threads | " + " | ".join(f"{rows} row{'s' * (rows > 1)}" for rows in row_counts) + " |")
    print("|---|---|" + "---|" * len(row_counts))
    for weights in ("float32", "int8"):
        for setting in SETTINGS:
            cells = [t for t in timings if t.weights == weights and t.setting == setting]
            if not cells:
                continue
            label = "MKL's default" if setting == "default" else setting
            print(f"| {weights} | {label} | " + " | ".join(_cell(t, rows=t.rows) for t in cells) + " |")
    print(
        "\nEach cell: the median step time over the rounds (ms per decode step) · tokens per second over all rows; "
        "every round's median in brackets."
    )


def _cell(timing: Timing, rows: int) -> str:
    median = statistics.median(timing.step_ms)
    runs = ", ".join(f"{value:.0f}" for value in timing.step_ms)
    return f"{median:.1f} ms · {rows * 1000 / median:.2f} tok/s ({runs})"


if __name__ == "__main__":
    main()
