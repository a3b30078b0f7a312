"""`uv run python -m bench.prefill_kernels [--model SPEC] [--tokens N] [--chunk C] [--rounds R]`: what the CPU
engine's numpy kernels do to a long prefill, measured on the model as exo's runner loads it (float32 on a Linux CPU).

Three variants take turns, round by round, on the same prompt of N tokens prefilled in chunks of C (as the runner
prefills a long prompt): mlx-lm's own attention and SwiGLU, the numpy attention softmax alone, and both numpy
kernels (what `--cpu-kernels auto` ships). Prints a Markdown table with the commit, CPU, load and command, for
docs/OPERATIONS.md ("Long prompts on a CPU").
"""

import argparse
import os
import sys
import time
from collections.abc import Sequence

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from bench.machine import record_start_commit, section_run
from bench.markdown import without_directories
from exo.models.paths import default_models_dir
from exo.models.resolve import resolve_model
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.cpu import kernels
from exo.worker.engines.mlx.model_loader import load_model

VARIANTS: dict[str, tuple[bool, bool]] = {
    "mlx-lm's kernels": (False, False),
    "numpy softmax": (True, False),
    "numpy softmax and SwiGLU (shipped)": (True, True),
}
"""Each variant: (numpy attention softmax, numpy SwiGLU)."""


def _route(module: object, attention: bool, swiglu: bool) -> None:
    """Point the model's module at the chosen kernels (load_model pointed it at both numpy ones)."""
    names = vars(module)
    names["scaled_dot_product_attention"] = kernels.scaled_dot_product_attention if attention else kernels.MLX_ATTENTION
    names["swiglu"] = kernels.swiglu if swiglu else kernels.MLX_SWIGLU


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.prefill_kernels")
    parser.add_argument("--model", help="model spec as `exo --model` takes it (default: exo's default model)")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=2)
    command = list(sys.argv[1:] if argv is None else argv)
    arguments = parser.parse_args(command)
    loaded = load_model(resolve_model(arguments.model, default_models_dir()).path, ShardAssignment())
    module = sys.modules[type(loaded.model).__module__]
    prompt = [(index * 37) % 20_000 + 100 for index in range(arguments.tokens)]
    seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(arguments.rounds):
        for name, (attention, swiglu) in VARIANTS.items():
            _route(module, attention, swiglu)
            cache = make_prompt_cache(loaded.model)
            started = time.perf_counter()
            for start in range(0, len(prompt), arguments.chunk):
                mx.eval(loaded.model(mx.array([prompt[start : start + arguments.chunk]]), cache=cache))
            seconds[name].append(time.perf_counter() - started)
    run = section_run(command, program="uv run python -m bench.prefill_kernels")
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    print(f"{arguments.tokens}-token prefill in {arguments.chunk}-token chunks, {loaded.dtype} weights")
    print(f"commit {run.exo_commit}, {run.cpu}, load average (1, 5, 15 min) {load} at the end, {run.finished_utc}")
    print(f"command `{without_directories(run.command)}`\n")
    print("| Variant | Seconds, each round | Best |")
    print("| --- | --- | --- |")
    for name, times in seconds.items():
        print(f"| {name} | {', '.join(f'{value:.1f}' for value in times)} | {min(times):.1f} |")


if __name__ == "__main__":
    record_start_commit()  # the commit as the run starts (bench/machine.py)
    main()
