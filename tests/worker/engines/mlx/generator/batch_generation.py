"""Prompts decoded as one batch through mlx-lm's BatchGenerator, as mlx-lm ships it or with exo's
`LazyLogprobsBatch` as its generation batch: each prompt's tokens and log-probabilities."""

from collections.abc import Sequence

import mlx.core as mx
from mlx import nn
from mlx_lm.generate import BatchGenerator

from exo.shared.types.tasks import SamplingParams
from exo.worker.engines.mlx.generator.batch_step import LazyLogprobsBatch
from exo.worker.engines.mlx.generator.sampling import Sampler, penalty_processors

PROMPTS = [[1, 5, 9, 12, 40], [7, 3], [2, 8, 8, 30, 31, 32, 33], [11, 12, 13]]
STEPS = 12


def generate(
    model: nn.Module,
    samplers: Sequence[Sampler],
    *,
    lazy: bool,
    penalised: bool = False,
    prompts: Sequence[list[int]] = PROMPTS,
    steps: int = STEPS,
) -> tuple[list[list[int]], list[list[mx.array]]]:
    """Each prompt's tokens and log-probabilities over `steps` steps of one batch (`lazy`: through exo's batch)."""
    generator = BatchGenerator(model, completion_batch_size=8, prefill_batch_size=8)
    if lazy:
        generator._generation_batch = LazyLogprobsBatch.empty(model, generator.sampler)  # pyright: ignore[reportPrivateUsage]
    processors = [
        list(penalty_processors(SamplingParams(repetition_penalty=1.5))) if penalised else [] for _ in prompts
    ]
    uids = generator.insert(
        list(prompts), max_tokens=[steps] * len(prompts), samplers=list(samplers), logits_processors=processors
    )
    tokens: dict[int, list[int]] = {uid: [] for uid in uids}
    logprobs: dict[int, list[mx.array]] = {uid: [] for uid in uids}
    for _ in range(steps * 3):
        for response in generator.next_generated():
            tokens[response.uid].append(response.token)
            logprobs[response.uid].append(response.logprobs)
    generator.close()
    return [tokens[uid] for uid in uids], [logprobs[uid] for uid in uids]
