"""What verifying a draft costs here, measured once when the runner starts (`StepCosts` seeded before any request).

The draft policy learns pass costs from the passes it runs, trying each unmeasured draft length once. Where a
one-token step and a longer pass take different code paths (the CPU engine's decode graph computes a one-token step
as one ggml graph, a longer pass goes through mlx-lm's model with ggml's products inside: 2-3x a graph step for two
tokens on the 2-core EPYC, docs/PERFORMANCE.md), those first tries cost the first requests a third of their decode
speed. So the runner times them before serving: a few passes of each length after a short context, whose cheapest
time against the one-token pass's is recorded as the policy would record it.
"""

import logging
import math
import time

from mlx import nn

from exo.worker.engines.mlx.cpu.forward_pass_probe import ForwardPassProbe
from exo.worker.engines.mlx.generator.draft_policy import StepCosts

logger = logging.getLogger(__name__)

ROUNDS = 2
"""Passes of each length timed (the cheapest counts: a pass slowed by another process says nothing of the length)."""


def measure_step_costs(model: nn.Module, costs: StepCosts, longest: int, rounds: int = ROUNDS) -> dict[int, float]:
    """Time passes feeding 1 to `longest` tokens (`rounds` each, after one warm-up pass) and record each length's
    cost relative to a one-token pass in `costs`; returns them (empty where the model's cache cannot drop the tokens a
    pass adds, so nothing can be probed)."""
    probe = ForwardPassProbe.for_model(model)
    if probe is None or longest < 1:
        return {}
    probe.prepare()
    probe.run(1)
    seconds: dict[int, float] = {}
    for _ in range(rounds):
        for fed in range(1, longest + 1):
            started = time.perf_counter()
            probe.run(fed)
            seconds[fed] = min(seconds.get(fed, math.inf), time.perf_counter() - started)
    probe.release()
    relative = {fed: spent / seconds[1] for fed, spent in seconds.items()}
    for fed, cost in relative.items():
        costs.record(fed, cost)
    logger.info(
        "pass costs against a one-token step (%.1f ms): %s",
        1000 * seconds[1],
        ", ".join(f"{fed} tokens {cost:.2f}x" for fed, cost in relative.items() if fed > 1),
    )
    return relative
