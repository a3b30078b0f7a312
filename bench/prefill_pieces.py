"""`uv run python -m bench.prefill_pieces [--model SPEC] [--tokens N,...] [--rounds R] [--only-paced]`: what a cold
prefill costs through the runner's own `PromptPrefill` (pieces paced as shipped), against whole passes over fixed
512-token pieces (how the runner prefilled before pieces were paced), on the model as exo's runner loads it (on a
Linux CPU: float32, the optimized BLAS preloaded, the matmul plan and CPU kernels on).

The variants take turns, round by round, so changing load falls on both alike. For each it reports the wall time,
the process's CPU time (steadier than wall time on a shared machine) and the longest step: the longest the runner
would go without reading its messages, so the longest a cancel waits. Prints a Markdown table with the commit, CPU,
load and command, for docs/OPERATIONS.md ("Prefill in pieces").
"""

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from bench.in_process import load_as_the_runner_does, print_run_header
from bench.machine import record_start_commit
from bench.worker_process import with_runners_blas

FIXED_PIECE_TOKENS = 512
GREEDY_TOKENS = 16


@dataclass
class _Timings:
    wall: list[float] = field(default_factory=list[float])
    cpu: list[float] = field(default_factory=list[float])
    longest_step: list[float] = field(default_factory=list[float])


def _timed(run: Callable[[], float], timings: _Timings) -> None:
    wall, cpu = time.perf_counter(), time.process_time()
    longest = run()
    timings.wall.append(time.perf_counter() - wall)
    timings.cpu.append(time.process_time() - cpu)
    timings.longest_step.append(longest)


def main(argv: Sequence[str] | None = None) -> None:
    command = list(sys.argv[1:] if argv is None else argv)
    with_runners_blas("bench.prefill_pieces", command)
    _measure(command)


def _measure(command: list[str]) -> None:
    import mlx.core as mx

    from exo.worker.engines.mlx.cache.layer_cache import materialize, new_prompt_cache
    from exo.worker.engines.mlx.generator.prefill import PiecePacer, PromptPrefill

    parser = argparse.ArgumentParser(prog="python -m bench.prefill_pieces")
    parser.add_argument("--model", help="model spec as `exo --model` takes it (default: exo's default model)")
    parser.add_argument("--tokens", default="2048", help="prompt lengths, comma-separated")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only-paced", action="store_true", help="skip the fixed-piece variant")
    arguments = parser.parse_args(command)
    loaded = load_as_the_runner_does(arguments.model)
    model = loaded.model
    load_before = os.getloadavg()

    finished: dict[int, tuple[list[Any], list[int]]] = {}
    continuations: dict[int, list[int]] = {}

    def paced(prompt: list[int]) -> float:
        prefill = PromptPrefill(model, new_prompt_cache(model), prompt, PiecePacer())
        longest = 0.0
        while not prefill.finished:
            started = time.perf_counter()
            prefill.step()
            longest = max(longest, time.perf_counter() - started)
        finished[len(prompt)] = (prefill.cache, prefill.pending)
        return longest

    def greedy_continuation(cache: list[Any], pending: list[int]) -> list[int]:
        """The greedy tokens after the prompt (outside the timing): the same in every version of the prefill."""
        tokens: list[int] = []
        last = pending
        for _ in range(GREEDY_TOKENS):
            logits = model(mx.array(last)[None], cache=cache)
            last = cast(list[int], mx.argmax(logits[0, -1:], axis=-1).tolist())
            tokens.append(last[0])
        return tokens

    def fixed(prompt: list[int]) -> float:
        cache = new_prompt_cache(model)
        longest = 0.0
        for start in range(0, len(prompt) - 1, FIXED_PIECE_TOKENS):
            started = time.perf_counter()
            model(mx.array(prompt[start : min(start + FIXED_PIECE_TOKENS, len(prompt) - 1)])[None], cache=cache)
            materialize(cache)
            mx.clear_cache()
            longest = max(longest, time.perf_counter() - started)
        return longest

    variants: dict[str, Callable[[list[int]], float]] = {
        "PromptPrefill, pieces paced as shipped": paced,
        f"whole passes over {FIXED_PIECE_TOKENS}-token pieces": fixed,
    }
    if arguments.only_paced:
        variants = dict(list(variants.items())[:1])
    lengths = [int(value) for value in arguments.tokens.split(",")]
    results: dict[tuple[int, str], _Timings] = {(n, name): _Timings() for n in lengths for name in variants}
    for length in lengths:
        prompt = [(index * 37) % 20_000 + 100 for index in range(length)]
        for _ in range(arguments.rounds):
            for name, variant in variants.items():
                _timed(lambda variant=variant, prompt=prompt: variant(prompt), results[(length, name)])
                if length in finished:  # outside the timing
                    continuations[length] = greedy_continuation(*finished.pop(length))
                print(f"{length} tokens, {name}: {results[(length, name)].wall[-1]:.1f} s", file=sys.stderr)
    print_run_header(
        f"Cold prefill, {loaded.dtype} weights, {arguments.rounds} round(s) with the variants taking turns",
        command,
        "bench.prefill_pieces",
        load_before,
    )
    print("| Prompt tokens | Variant | Wall s, each round | CPU s, each round | Longest step s |")
    print("| --- | --- | --- | --- | --- |")
    for (length, name), timings in results.items():
        print(
            f"| {length} | {name} | {', '.join(f'{value:.1f}' for value in timings.wall)} "
            f"| {', '.join(f'{value:.1f}' for value in timings.cpu)} | {max(timings.longest_step):.2f} |"
        )
    print(f"\nGreedy continuation ({GREEDY_TOKENS} tokens) after each paced prefill, last round:")
    for length, tokens in continuations.items():
        print(f"- {length} tokens: {tokens}")


if __name__ == "__main__":
    record_start_commit()  # the commit as the run starts (bench/machine.py); the re-exec in main() inherits it
    main()
