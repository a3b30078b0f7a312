"""Tiny random Qwen2-shaped models and a greedy generation driver for prefix-cache tests."""

import random
from collections.abc import Sequence
from pathlib import Path

import mlx.core as mx
import pytest
from mlx import nn
from mlx.utils import tree_map
from mlx_lm.generate import generate_step
from mlx_lm.models.qwen2 import Model, ModelArgs

from exo.worker.engines.mlx.cache import CacheLease, PrefixCache
from exo.worker.engines.mlx.cache.disk_tier import MIN_SNAPSHOT_TOKENS, DiskTier
from exo.worker.engines.mlx.cache.layer_cache import PromptCache, new_prompt_cache

VOCAB_SIZE = 256
UNLIMITED = 1 << 40
"""A byte budget no test here reaches."""
NEW_TOKENS = 8
TINY_IDENTITY = "tiny-qwen2-hidden64-layers2"
"""The model identity disk snapshots of `tiny_model` are written under."""


def build_qwen2(hidden_size: int, num_layers: int, seed: int = 0) -> nn.Module:
    """A randomly initialised Qwen2 model (no weights or tokenizer needed).

    Weights are doubled from mlx's default init: at the default scale a random model ignores its context and repeats
    one token, which would let a wrongly reused cache go unnoticed; doubled, every prompt token changes the output.
    """
    mx.random.seed(seed)
    args = ModelArgs(
        model_type="qwen2",
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        intermediate_size=hidden_size * 3,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        vocab_size=VOCAB_SIZE,
    )
    model = Model(args)
    model.update(tree_map(lambda weight: weight * 2, model.parameters()))
    mx.eval(model.parameters())
    return model


def greedy(model: nn.Module, prompt: Sequence[int], cache: PromptCache, max_tokens: int) -> list[int]:
    """Greedy tokens for ``prompt`` continuing from ``cache`` (mutated in place, as mlx-lm does)."""
    steps = generate_step(mx.array(list(prompt)), model, max_tokens=max_tokens, prompt_cache=cache)
    return [int(token) for token, _ in steps]


def greedy_uncached(model: nn.Module, prompt: Sequence[int], max_tokens: int) -> list[int]:
    """The reference: greedy tokens for the whole prompt from an empty cache."""
    return greedy(model, prompt, new_prompt_cache(model), max_tokens)


def run_turn(
    prefix_cache: PrefixCache, model: nn.Module, prompt: Sequence[int], max_tokens: int
) -> tuple[list[int], CacheLease]:
    """One generation the way the runner does it: acquire, prefill only the rest, release prompt + output."""
    lease = prefix_cache.acquire(prompt)
    generated = greedy(model, lease.remaining_tokens, lease.cache, max_tokens)
    prefix_cache.release(lease, [*prompt, *generated])
    return generated, lease


def random_tokens(count: int, seed: int) -> list[int]:
    """Deterministic pseudo-random token ids."""
    generator = random.Random(seed)
    return [generator.randrange(VOCAB_SIZE) for _ in range(count)]


@pytest.fixture(scope="session")
def tiny_model() -> nn.Module:
    """Hidden 64, 2 layers, vocab 256: generates in milliseconds."""
    return build_qwen2(hidden_size=64, num_layers=2)


SYSTEM_PROMPT = random_tokens(MIN_SNAPSHOT_TOKENS + 40, seed=900)
"""An agent's system prompt, long enough to be snapshotted on disk."""


def session_prompt(session: int) -> list[int]:
    """A new session of one agent: the shared system prompt, then its own first message."""
    return [*SYSTEM_PROMPT, *random_tokens(30, seed=910 + session)]


def tiny_disk_tier(
    directory: Path,
    model: nn.Module,
    *,
    budget: int = UNLIMITED,
    identity: str = TINY_IDENTITY,
    queue: int = UNLIMITED,
    write_beside_above: int | None = None,
) -> DiskTier:
    """A disk tier in `directory` for `model` (`tiny_model` unless `identity` says otherwise)."""
    return DiskTier(
        directory, budget, identity, model, queue_budget_bytes=queue, write_beside_above_bytes=write_beside_above
    )
