"""What every rank of a pipeline does together, in the same order, besides the batch's decode steps: agree on the
cached prefix of a joining prompt, and prefill the same chunks of it."""

import time
from collections.abc import Sequence
from typing import cast

import mlx.core as mx
from mlx import nn
from mlx_lm.generate import generation_stream

from exo.worker.engines.mlx.cache.layer_cache import PromptCache, materialize
from exo.worker.engines.mlx.cache.prefix_cache import PrefixCache
from exo.worker.engines.mlx.distributed.layer_split import stage_forward


def agree_on_cached_tokens(group: mx.distributed.Group, cached_tokens: int) -> int:
    """The cached-prefix length every rank holds: the smallest of the ranks' own prefix-cache hits."""
    agreed = mx.distributed.all_min(mx.array([cached_tokens], dtype=mx.int64), group=group, stream=mx.cpu)
    (value,) = cast(list[int], agreed.tolist())
    return value


def prefill(
    model: nn.Module,
    cache: PromptCache,
    tokens: Sequence[int],
    step_size: int,
    *,
    prefix_cache: PrefixCache | None = None,
) -> None:
    """Feed `tokens` in chunks of `step_size`; every rank runs the same chunks (each one crosses the whole ring).
    `prefix_cache` is told the seconds it took: on every rank what the whole ring took (a rank waits for the others'
    stages), the cost of a token a snapshot's load would save."""
    started = time.perf_counter()
    for begin in range(0, len(tokens), step_size):
        chunk = mx.array(list(tokens[begin : begin + step_size]))[None]
        with mx.stream(generation_stream):
            # Even rank 0 evaluates its stage output here: mlx-lm's pipelines end every pass with an all-gather.
            mx.eval(stage_forward(model, chunk, cache, leader=False))
            materialize(cache)
        mx.clear_cache()
    if prefix_cache is not None:
        prefix_cache.prefilled(len(tokens), time.perf_counter() - started)
