"""A rank other than 0 running one task: it feeds the tokens rank 0 chooses through its layers until rank 0 says
the request ended.

It parses nothing and emits nothing. Its prefix cache is its own (it holds only this rank's layers), so the ranks
first agree on how much of the prompt every one of them holds, and each prefills from there.

A follower that cannot go on must not stay alive: rank 0 would wait for it on the ring forever. Any error here
propagates and ends the process, which breaks the ring and fails the request on rank 0 with an error.
"""

import logging
from dataclasses import dataclass

from exo.worker.engines.mlx.cache.layer_cache import new_prompt_cache
from exo.worker.engines.mlx.cache.prefix_cache import PrefixCache
from exo.worker.engines.mlx.distributed.lockstep import (
    StepOutcome,
    agree_on_cached_tokens,
    forward_last,
    prefill,
    share_step,
)
from exo.worker.engines.mlx.distributed.task_channel import FollowTask
from exo.worker.engines.mlx.utils_mlx import LoadedModel

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FollowedTask:
    """How a followed task ended on this rank."""

    outcome: StepOutcome
    cached_tokens: int
    generated_tokens: int


def follow_task(
    loaded: LoadedModel, prefix_cache: PrefixCache | None, message: FollowTask, prefill_step_size: int
) -> FollowedTask:
    """Run this rank's part of `message.task` in step with rank 0."""
    group = loaded.group
    if group is None:
        raise ValueError("only a pipeline rank follows tasks")
    prompt = list(message.prompt_tokens)
    lease = prefix_cache.acquire(prompt) if prefix_cache is not None else None
    agreed = agree_on_cached_tokens(group, lease.cached_tokens if lease else 0)
    if lease is not None and prefix_cache is not None:
        lease = prefix_cache.shorten(lease, agreed)
    cache = lease.cache if lease is not None else new_prompt_cache(loaded.model)
    rest = prompt[agreed:]
    prefill(loaded.model, cache, rest[:-1], prefill_step_size)
    pending = rest[-1:]
    shared: list[int] = []
    while True:
        forward_last(loaded.model, cache, pending, leader=False)
        token, outcome = share_step(group, None)
        shared.append(token)
        if outcome != StepOutcome.CONTINUE:
            break
        pending = [token]
    if lease is not None and prefix_cache is not None:
        if outcome == StepOutcome.FAILED:
            prefix_cache.discard(lease)
        else:
            # The cache holds the prompt and every token fed; the last shared one never was (filed accordingly).
            prefix_cache.release(lease, [*prompt, *shared])
    logger.debug("followed task %s: %s after %d tokens", message.task.task_id, outcome.name, len(shared))
    return FollowedTask(outcome=outcome, cached_tokens=agreed, generated_tokens=len(shared))
