"""What the pipeline tests run on each rank: load a shard, decode greedily in lockstep, report what happened.

The lockstep here is the one-request protocol pipelines served with before they batched: one forward pass per step
and rank 0's token shared by an all-sum (the other ranks add zeros). It still checks what the layer split computes
and that every rank feeds rank 0's token.
"""

import random
import re
from collections.abc import Sequence
from enum import IntEnum
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
from mlx import nn
from mlx.utils import tree_flatten
from mlx_lm.generate import generation_stream

from exo.shared.types.tasks import SamplingParams
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.cache.layer_cache import PromptCache, new_prompt_cache
from exo.worker.engines.mlx.distributed.layer_split import stage_forward
from exo.worker.engines.mlx.distributed.lockstep import prefill
from exo.worker.engines.mlx.generator.sampling import make_request_sampler
from exo.worker.engines.mlx.model_loader import load_model


class StepOutcome(IntEnum):
    """What rank 0 decided after choosing a step's token (0 is never sent: a sum of zeros means no leader)."""

    CONTINUE = 1
    FINISHED = 2
    CANCELLED = 3
    FAILED = 4


class RingProtocolError(RuntimeError):
    """A rank received something rank 0 can never send: the ranks are out of step."""


def share_step(group: mx.distributed.Group, choice: tuple[int, StepOutcome] | None) -> tuple[int, StepOutcome]:
    """Rank 0 passes its (token, outcome); every other rank passes None and receives rank 0's."""
    token, outcome = choice if choice is not None else (0, 0)
    summed = mx.distributed.all_sum(mx.array([token, int(outcome)], dtype=mx.int64), group=group, stream=mx.cpu)
    shared_token, shared_outcome = cast(list[int], summed.tolist())
    try:
        return shared_token, StepOutcome(shared_outcome)
    except ValueError as error:
        raise RingProtocolError(f"rank 0 sent step outcome {shared_outcome}") from error


def forward_last(model: nn.Module, cache: PromptCache, tokens: Sequence[int], *, leader: bool) -> mx.array | None:
    """Feed `tokens` (the last prompt token, then each chosen token); rank 0 gets the last position's logits."""
    with mx.stream(generation_stream):
        output = stage_forward(model, mx.array(list(tokens))[None], cache, leader=leader)
        if not leader:
            mx.eval(output)
            return None
        return output[0, -1:, :]


PROMPT = (5, 17, 42, 99, 7, 3, 250, 11, 64, 8)
STEPS = 6


def held_layer_count(model: nn.Module) -> int:
    """How many layers' weights this rank holds at all."""
    names = [name for name, _ in cast(list[tuple[str, mx.array]], tree_flatten(model.parameters()))]
    return len({int(match.group(1)) for name in names if (match := re.search(r"layers\.(\d+)\.", name))})


def layer_fingerprints(model: nn.Module) -> list[float]:
    """A checksum of each layer this rank runs, in order: which of the whole model's layers they are."""
    layers = cast(list[nn.Module], model.layers)
    return [cast(float, mx.sum(cast(Any, layer).self_attn.q_proj.weight).item()) for layer in layers]


def greedy_in_lockstep(shard: ShardAssignment, model_dir: Path, group: mx.distributed.Group) -> dict[str, object]:
    """Prefill PROMPT in chunks of 3, then STEPS greedy tokens chosen by rank 0; rank 0 also returns its logits."""
    loaded = load_model(model_dir, shard, group=group)
    leader = shard.rank == 0
    cache: PromptCache = new_prompt_cache(loaded.model)
    prefill(loaded.model, cache, PROMPT[:-1], step_size=3)
    pending = list(PROMPT[-1:])
    tokens: list[int] = []
    logits_rows: list[list[float]] = []
    for step in range(STEPS):
        logits = forward_last(loaded.model, cache, pending, leader=leader)
        choice = None
        if logits is not None:
            logits_rows.append(cast(list[float], logits[0].tolist()))
            outcome = StepOutcome.CONTINUE if step < STEPS - 1 else StepOutcome.FINISHED
            choice = (cast(int, mx.argmax(logits[0]).item()), outcome)
        token, _ = share_step(group, choice)
        tokens.append(token)
        pending = [token]
    return {
        "strategy": loaded.strategy,
        "tokens": tokens,
        "logits": logits_rows,
        "held_layers": held_layer_count(loaded.model),
        "fingerprints": layer_fingerprints(loaded.model),
    }


def greedy_alone(model_dir: Path) -> dict[str, object]:
    """The same decode, in the same chunks, by the whole model in one process."""
    loaded = load_model(model_dir, ShardAssignment())
    cache = new_prompt_cache(loaded.model)
    prefill(loaded.model, cache, PROMPT[:-1], step_size=3)
    pending = list(PROMPT[-1:])
    tokens: list[int] = []
    logits_rows: list[list[float]] = []
    for _ in range(STEPS):
        logits = forward_last(loaded.model, cache, pending, leader=True)
        assert logits is not None
        logits_rows.append(cast(list[float], logits[0].tolist()))
        tokens.append(cast(int, mx.argmax(logits[0]).item()))
        pending = tokens[-1:]
    return {"tokens": tokens, "logits": logits_rows, "fingerprints": layer_fingerprints(loaded.model)}


def own_choices_differ(shard: ShardAssignment, model_dir: Path, group: mx.distributed.Group) -> dict[str, object]:
    """Every rank has its own idea of each next token (rank 0 samples its logits, the others draw at random, as
    ranks with unsynchronised samplers would); what each rank feeds is what `share_step` gives it."""
    loaded = load_model(model_dir, shard, group=group)
    leader = shard.rank == 0
    own_random = random.Random(1000 + shard.rank)
    rank_sampler = make_request_sampler(SamplingParams(temperature=1.5, seed=11))
    cache: PromptCache = new_prompt_cache(loaded.model)
    prefill(loaded.model, cache, PROMPT[:-1], step_size=4)
    pending = list(PROMPT[-1:])
    own: list[int] = []
    fed: list[int] = []
    logits_rows: list[list[float]] = []
    for step in range(STEPS):
        logits = forward_last(loaded.model, cache, pending, leader=leader)
        if logits is not None:
            logits_rows.append(cast(list[float], logits[0].tolist()))
            (mine,) = cast(list[int], rank_sampler(logits - mx.logsumexp(logits, axis=-1, keepdims=True)).tolist())
        else:
            mine = own_random.randrange(loaded.vocabulary_size)
        own.append(mine)
        outcome = StepOutcome.CONTINUE if step < STEPS - 1 else StepOutcome.FINISHED
        token, _ = share_step(group, (mine, outcome) if leader else None)
        fed.append(token)
        pending = [token]
    return {"own": own, "fed": fed, "logits": logits_rows}


def fed_alone(model_dir: Path, tokens: list[int]) -> list[list[float]]:
    """The logits one whole-model process computes when it is fed PROMPT then `tokens`, in the same chunks."""
    loaded = load_model(model_dir, ShardAssignment())
    cache = new_prompt_cache(loaded.model)
    prefill(loaded.model, cache, PROMPT[:-1], step_size=4)
    pending = list(PROMPT[-1:])
    rows: list[list[float]] = []
    for token in tokens:
        logits = forward_last(loaded.model, cache, pending, leader=True)
        assert logits is not None
        rows.append(cast(list[float], logits[0].tolist()))
        pending = [token]
    return rows
