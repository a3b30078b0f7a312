"""`python -m bench.batch_step MODEL_DIR`: one batched decode step with and without evaluating log-probabilities.

mlx-lm's BatchGenerator normalizes and evaluates every member's log-probabilities each step; exo's batch
(`generator/batch_step.py`) leaves them lazy and takes a greedy member's argmax from its logits. Both run here on the
same model, greedy, N members, in alternating rounds (so both see the same load), and the median step of each is
printed with the load average. Run with exo's runner environment (its BLAS preloaded before mlx loads), as the
runner has it.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from bench.worker_process import with_runners_blas

if TYPE_CHECKING:
    from mlx import nn


class BatchStepReport(BaseModel):
    members: int
    steps_per_round: int
    rounds: int
    stock_median_ms: float
    lazy_median_ms: float
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]


def _round(model: "nn.Module", members: int, steps: int, *, lazy: bool) -> list[float]:
    """Step times (seconds) of one batch of `members` greedy sequences, after its first tokens."""
    from mlx_lm.generate import BatchGenerator

    from exo.worker.engines.mlx.generator.batch_step import LazyLogprobsBatch

    generator = BatchGenerator(model, completion_batch_size=members, prefill_batch_size=members)
    if lazy:
        generator._generation_batch = LazyLogprobsBatch.empty(model, generator.sampler)  # pyright: ignore[reportPrivateUsage]
    prompts = [[100 + member, 200 + member, 300 + member] for member in range(members)]
    generator.insert(prompts, max_tokens=[steps + 4] * members)
    while not generator.next_generated():
        pass  # prefill and the first step
    times: list[float] = []
    for _ in range(steps):
        started = time.perf_counter()
        generator.next_generated()
        times.append(time.perf_counter() - started)
    generator.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.batch_step", description=__doc__)
    parser.add_argument("model", type=Path)
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=4)
    arguments = parser.parse_args()
    with_runners_blas("bench.batch_step", sys.argv[1:])
    from exo.shared.types.worker.shards import ShardAssignment
    from exo.worker.engines.mlx.model_loader import load_model

    model = load_model(arguments.model, ShardAssignment()).model
    load_before = os.getloadavg()
    stock: list[float] = []
    lazy: list[float] = []
    for _ in range(arguments.rounds):
        stock += _round(model, arguments.members, arguments.steps, lazy=False)
        lazy += _round(model, arguments.members, arguments.steps, lazy=True)
    report = BatchStepReport(
        members=arguments.members,
        steps_per_round=arguments.steps,
        rounds=arguments.rounds,
        stock_median_ms=statistics.median(stock) * 1000,
        lazy_median_ms=statistics.median(lazy) * 1000,
        load_before=load_before,
        load_after=os.getloadavg(),
    )
    print(report.model_dump_json(indent=1))


if __name__ == "__main__":
    main()
