"""`python -m bench.graph_build_warmth MODEL_DIR`: how long building one decode step's forward pass takes, by what the
process did just before (issue 36, host work per step on a CPU).

In-process, with the runner's BLAS preloaded and the model loaded as the runner loads it (compiled blocks included
where they fit): the model's decoder (embedding, layers, final norm; no output head, no evaluation) is built for one
token over a cache of a few tokens, again and again, and each build is timed. Between builds, by condition: nothing
(built again at once, nothing evaluated), the previous build evaluated, 2 ms of Python work, a 2 ms sleep, the output
head's product evaluated (the vocabulary's matrix streamed through the caches, as every decode step does), or a 40 MB
numpy read. On a CPU the model's own compute shares the cores' caches with the host's Python, which an accelerator's
does not: this shows how much of the host's `graph` time is that. Conditions take turns, round by round. Prints JSON
and a table of medians (µs) per round.
"""

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from bench.worker_process import with_runners_blas

CONDITIONS = (
    "built again at once, nothing evaluated",
    "right after the previous build evaluated",
    "after 2 ms of Python work",
    "after a 2 ms sleep",
    "after the output head's product evaluated",
    "after a 40 MB numpy read",
)


class WarmthReport(BaseModel):
    model: str
    compiled_layers: int
    builds_per_round: int
    medians_us: dict[str, list[float]]
    """Condition to its median build time in each round (µs)."""
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.graph_build_warmth", description=__doc__)
    parser.add_argument("model", type=Path)
    parser.add_argument("--builds", type=int, default=300, help="builds a condition a round")
    parser.add_argument("--rounds", type=int, default=2)
    arguments = parser.parse_args()
    with_runners_blas("bench.graph_build_warmth", sys.argv[1:])
    report = measure(arguments.model, arguments.builds, arguments.rounds)
    print(report.model_dump_json(indent=1))
    print("| Before the build | " + " | ".join(f"round {index + 1} µs" for index in range(arguments.rounds)) + " |")
    print("|---|" + "---|" * arguments.rounds)
    for condition, medians in report.medians_us.items():
        print(f"| {condition} | " + " | ".join(f"{value:.0f}" for value in medians) + " |")


def measure(model_dir: Path, builds: int, rounds: int) -> WarmthReport:
    import os

    import mlx.core as mx
    import numpy as np
    from mlx_lm.models.cache import make_prompt_cache

    from exo.shared.types.worker.shards import ShardAssignment
    from exo.worker.engines.mlx.compiled_blocks import compiled_layers
    from exo.worker.engines.mlx.model_loader import load_model

    model: Any = load_model(model_dir, ShardAssignment()).model
    decoder: Any = model.model
    cache: list[Any] = make_prompt_cache(model)
    mx.eval(model(mx.array([[1, 2, 3, 4]]), cache=cache))
    token = mx.array([[5]])
    hidden = mx.zeros((1, 1, decoder.embed_tokens.weight.shape[1]))
    memory = np.ones(10_000_000, dtype=np.float32)
    mx.eval(token, hidden)

    def python_work() -> None:
        deadline = time.perf_counter() + 0.002
        while time.perf_counter() < deadline:
            pass

    before: dict[str, Callable[[], object]] = {
        CONDITIONS[0]: lambda: None,
        CONDITIONS[1]: lambda: None,
        CONDITIONS[2]: python_work,
        CONDITIONS[3]: lambda: time.sleep(0.002),
        CONDITIONS[4]: lambda: mx.eval(decoder.embed_tokens.as_linear(hidden)),
        CONDITIONS[5]: memory.sum,
    }

    def median_build_us(condition: str) -> float:
        seconds: list[float] = []
        for _ in range(builds):
            before[condition]()
            start = time.perf_counter()
            built = decoder(token, cache=cache)
            seconds.append(time.perf_counter() - start)
            if condition != CONDITIONS[0]:
                mx.eval(built)
            for layer_cache in cache:  # the same cache length for every build
                layer_cache.offset -= 1
        mx.eval([layer_cache.state for layer_cache in cache])  # the unevaluated builds' cache writes, not carried on
        return statistics.median(seconds) * 1e6

    load_before = os.getloadavg()
    medians: dict[str, list[float]] = {condition: [] for condition in CONDITIONS}
    for _ in range(rounds):
        for condition in CONDITIONS:
            medians[condition].append(round(median_build_us(condition), 1))
    return WarmthReport(
        model=str(model_dir),
        compiled_layers=compiled_layers(model),
        builds_per_round=builds,
        medians_us=medians,
        load_before=load_before,
        load_after=os.getloadavg(),
    )


if __name__ == "__main__":
    main()
