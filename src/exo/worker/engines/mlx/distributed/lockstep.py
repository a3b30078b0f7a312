"""What every rank of a pipeline does together, in the same order: agree on the cached prefix, prefill the same
chunks, run one forward pass per step and take rank 0's token.

Only rank 0 chooses tokens (its grammar mask, penalties and sampler), and it shares each choice with every rank
together with whether the request goes on, so every rank feeds the same token into its layers whatever processors
it has. The exchange is one all-sum of two integers per token: the other ranks add zeros.
"""

from collections.abc import Sequence
from enum import IntEnum
from typing import cast

import mlx.core as mx
from mlx import nn
from mlx_lm.generate import generation_stream

from exo.worker.engines.mlx.cache.layer_cache import PromptCache, materialize
from exo.worker.engines.mlx.distributed.layer_split import stage_forward


class StepOutcome(IntEnum):
    """What rank 0 decided after choosing a step's token (0 is never sent: a sum of zeros means no leader)."""

    CONTINUE = 1
    FINISHED = 2
    CANCELLED = 3
    FAILED = 4


class RingProtocolError(RuntimeError):
    """A rank received something rank 0 can never send: the ranks are out of step."""


def agree_on_cached_tokens(group: mx.distributed.Group, cached_tokens: int) -> int:
    """The cached-prefix length every rank holds: the smallest of the ranks' own prefix-cache hits."""
    agreed = mx.distributed.all_min(mx.array([cached_tokens], dtype=mx.int64), group=group, stream=mx.cpu)
    (value,) = cast(list[int], agreed.tolist())
    return value


def share_step(group: mx.distributed.Group, choice: tuple[int, StepOutcome] | None) -> tuple[int, StepOutcome]:
    """Rank 0 passes its (token, outcome); every other rank passes None and receives rank 0's."""
    token, outcome = choice if choice is not None else (0, 0)
    summed = mx.distributed.all_sum(mx.array([token, int(outcome)], dtype=mx.int64), group=group, stream=mx.cpu)
    shared_token, shared_outcome = cast(list[int], summed.tolist())
    try:
        return shared_token, StepOutcome(shared_outcome)
    except ValueError as error:
        raise RingProtocolError(f"rank 0 sent step outcome {shared_outcome}") from error


def prefill(model: nn.Module, cache: PromptCache, tokens: Sequence[int], step_size: int) -> None:
    """Feed `tokens` in chunks of `step_size`; every rank runs the same chunks (each one crosses the whole ring)."""
    for begin in range(0, len(tokens), step_size):
        chunk = mx.array(list(tokens[begin : begin + step_size]))[None]
        with mx.stream(generation_stream):
            # Even rank 0 evaluates its stage output here: mlx-lm's pipelines end every pass with an all-gather.
            mx.eval(stage_forward(model, chunk, cache, leader=False))
            materialize(cache)
        mx.clear_cache()


def forward_last(model: nn.Module, cache: PromptCache, tokens: Sequence[int], *, leader: bool) -> mx.array | None:
    """Feed `tokens` (the last prompt token, then each chosen token); rank 0 gets the last position's logits."""
    with mx.stream(generation_stream):
        output = stage_forward(model, mx.array(list(tokens))[None], cache, leader=leader)
        if not leader:
            mx.eval(output)
            return None
        return output[0, -1:, :]
