"""Decode steps over 1 to 8 sequences by weight format (`--cpu-weights`, issue 33) and thread count.

MKL's threaded integer GEMM at one row was measured slower than one thread on a loaded Xeon, and ggml's spinning
pool slower at 2 threads on 2 loaded cores; this times whole decode steps, to choose each format's thread counts.
The formats are loaded in one process, the way a runner loads them (exo's `load_model` under `CpuKernels`), with
the BLAS the node preloads; every setting takes its turn in every round, so load from other processes falls on all
alike. A decode step over R rows is one batched step over R sequences (one token each) after a short prompt.

Settings: MKL's thread count, `1`, `2` or `default` (MKL's own count, the engine's behaviour; float32 is measured
this way only), and for q8_0 and gguf the threads of ggml's pool (`--ggml-threads`: 1, 2 and `auto`, the engine's
choice, every core), and with `--grouping on,off` q8_0's sibling layers (q/k/v, gate/up) computed as one ggml graph
(`on`, the engine's behaviour) or one graph a product (`off`). Also the process's resident memory as each format
loads (VmRSS growth, in load order: put one format alone in `--weights` for its own figure). Prints Markdown with
commit, CPU, load and command. Not a test. q8_0 and gguf need ggml's CPU library (`uv run exo ggml build`); gguf a
model imported with its GGUF kept.

`uv run python -m bench.decode_threads [--model SPEC] [--weights float32,q8_0,gguf,int8] [--rounds N] [--steps N]
[--rows 1,4,8] [--ggml-threads 1,2,auto] [--grouping on,off]`
"""

import argparse
import ctypes
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal, cast

from pydantic import BaseModel

from bench.machine import run_bench_worker

Setting = Literal["1", "2", "default"]
SETTINGS: tuple[Setting, ...] = ("1", "2", "default")
PROMPT_TOKENS = 64


class Timing(BaseModel):
    weights: str
    setting: Setting
    rows: int
    ggml_threads: str | None = None
    """ggml's pool size under q8_0 or gguf: a count, or `auto` (the engine's choice: the cores others leave)."""
    grouping: str | None = None
    """q8_0's sibling layers: `on` (one ggml graph per group, the engine's behaviour) or `off` (one a product)."""
    step_ms: list[float] = []


def _settings(weights: str, ggml_threads: list[str]) -> list[tuple[Setting, str | None]]:
    """(MKL threads, ggml threads) measured for a format: int8 all MKL settings; q8_0 and gguf each ggml count under
    MKL's default and under one MKL thread (whether the two pools fight); float32 MKL's default only."""
    if weights == "int8":
        return [(setting, None) for setting in SETTINGS]
    if weights in ("q8_0", "gguf"):
        return [(setting, threads) for setting in ("default", "1") for threads in ggml_threads]
    return [("default", None)]


def _worker(
    model_spec: str | None,
    rounds: int,
    steps: int,
    row_counts: list[int],
    *,
    formats: list[str],
    ggml_threads: list[str],
    grouping: list[str],
) -> None:
    import mlx.core as mx
    from mlx import nn
    from mlx_lm.models.cache import make_prompt_cache

    from exo.models.paths import default_models_dir
    from exo.models.resolve import resolve_model
    from exo.shared.types.cpu_kernels import CpuWeightsSetting
    from exo.shared.types.worker.shards import ShardAssignment
    from exo.worker.engines.mlx.cpu import int8_layers
    from exo.worker.engines.mlx.cpu.engine import CpuKernels
    from exo.worker.engines.mlx.cpu.q8_layers import Q8Embedding, Q8Linear
    from exo.worker.engines.mlx.model_loader import load_model

    mkl = ctypes.CDLL(str(int8_layers.mkl_int8().library))  # the library already loaded: MKL's one thread setting
    set_threads: Callable[[int], None] = mkl.MKL_Set_Num_Threads
    default_threads = int(mkl.MKL_Get_Max_Threads())
    path = resolve_model(model_spec, default_models_dir()).path
    models: dict[str, nn.Module] = {}
    for weights in formats:
        before = _resident_kib("VmRSS")
        models[weights] = load_model(
            path, ShardAssignment(), cpu_kernels=CpuKernels("auto", weights=cast(CpuWeightsSetting, weights))
        ).model
        grown, peak = (_resident_kib("VmRSS") - before) / 1024, _resident_kib("VmHWM") / 1024
        _progress(f"loaded {weights}: resident memory grew {grown:.1f} MiB (peak {peak:.1f} MiB)")
        print(json.dumps({"resident": weights, "grown_mib": grown, "peak_mib": peak}))
    _progress(f"loaded; MKL's default thread count {default_threads}")
    siblings = {
        weights: [(module, module.shared) for _, module in model.named_modules() if isinstance(module, Q8Linear)]
        for weights, model in models.items()
    }
    timings = {
        (weights, setting, threads, group, rows): Timing(
            weights=weights, setting=setting, rows=rows, ggml_threads=threads, grouping=group
        )
        for weights in models
        for setting, threads in _settings(weights, ggml_threads)
        for group in (grouping if weights in ("q8_0", "gguf") else [None])
        for rows in row_counts
    }
    for round_number in range(rounds):
        for key, timing in timings.items():
            weights, setting, threads, group, rows = key
            for module, shared in siblings[weights]:
                module.shared = None if group == "off" else shared
            set_threads(default_threads if setting == "default" else int(setting))
            model = models[weights]
            if threads is not None:
                for _, module in model.named_modules():
                    if isinstance(module, (Q8Linear, Q8Embedding)):
                        module.q8.use_threads(None if threads == "auto" else int(threads))
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
            ggml = "" if threads is None else f" ggml {threads}" + ("" if group is None else f" grouping {group}")
            _progress(
                f"round {round_number + 1}: {weights} MKL {setting}{ggml} rows {rows}: {timing.step_ms[-1]:.1f} ms/step"
            )
    for timing in timings.values():
        print(timing.model_dump_json())


def _resident_kib(field: str) -> int:
    """This process's `field` (VmRSS: resident now; VmHWM: its peak) from /proc/self/status, in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0


def _progress(line: str) -> None:
    print(f"[bench.decode_threads {time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description="decode steps by weight format and thread count")
    parser.add_argument("--model", default=None, help="a model spec as `exo --model` takes (default: the default)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8, help="decode steps timed per setting and round")
    parser.add_argument("--rows", default="1,4,8", help="comma-separated sequence counts")
    parser.add_argument("--weights", default="float32,q8_0,int8", help="comma-separated formats (--cpu-weights)")
    parser.add_argument(
        "--ggml-threads",
        default="1,2,auto",
        help="comma-separated ggml pool sizes (q8_0, gguf); auto: the engine's rule",
    )
    parser.add_argument(
        "--grouping", default="on", help="comma-separated q8_0 sibling grouping: on (one graph per group), off"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    row_counts = [int(value) for value in arguments.rows.split(",")]
    formats = arguments.weights.split(",")
    ggml_threads = arguments.ggml_threads.split(",")
    grouping = arguments.grouping.split(",")
    if arguments.worker:
        _worker(
            arguments.model,
            arguments.rounds,
            arguments.steps,
            row_counts,
            formats=formats,
            ggml_threads=ggml_threads,
            grouping=grouping,
        )
        return
    run = run_bench_worker("bench.decode_threads")
    lines = [line for line in run.stdout.strip().splitlines() if line.startswith("{")]
    resident = [json.loads(line) for line in lines if line.startswith('{"resident"')]
    timings = [Timing.model_validate_json(line) for line in lines if not line.startswith('{"resident"')]
    print(run.header)
    header = " | ".join(f"{rows} row{'s' * (rows > 1)}" for rows in row_counts)
    print(f"| weights | MKL threads | ggml threads | {header} |")
    print("|---|---|---|" + "---|" * len(row_counts))
    for weights in formats:
        for setting, threads in _settings(weights, ggml_threads):
            for group in grouping if weights in ("q8_0", "gguf") else [None]:
                key = (weights, setting, threads, group)
                cells = [t for t in timings if (t.weights, t.setting, t.ggml_threads, t.grouping) == key]
                if not cells:
                    continue
                label = "MKL's default" if setting == "default" else setting
                ggml = "-" if threads is None else threads
                if group is not None and len(grouping) > 1:
                    ggml += ", q/k/v and gate/up one graph" if group == "on" else ", one graph a product"
                print(f"| {weights} | {label} | {ggml} | " + " | ".join(_cell(t, rows=t.rows) for t in cells) + " |")
    print(
        "\nEach cell: the median step time over the rounds (ms per decode step) · tokens per second over all rows; "
        "every round's median in brackets."
    )
    grown = "; ".join(f"{r['resident']} +{r['grown_mib']:.1f} MiB (peak {r['peak_mib']:.1f} MiB)" for r in resident)
    print(f"\nResident memory as each format loaded, in load order (VmRSS growth; the process's VmHWM after): {grown}.")


def _cell(timing: Timing, rows: int) -> str:
    median = statistics.median(timing.step_ms)
    runs = ", ".join(f"{value:.0f}" for value in timing.step_ms)
    return f"{median:.1f} ms · {rows * 1000 / median:.2f} tok/s ({runs})"


if __name__ == "__main__":
    main()
