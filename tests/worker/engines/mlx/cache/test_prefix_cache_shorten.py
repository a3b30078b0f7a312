"""Shortening a lease to the prefix every pipeline rank holds: generation from it matches generation without it."""

import pytest
from mlx import nn

from exo.worker.engines.mlx.cache import PrefixCache
from exo.worker.engines.mlx.cache.layer_cache import held_token_count
from tests.worker.engines.mlx.cache.conftest import greedy, greedy_uncached, random_tokens, run_turn


def test_a_shortened_lease_holds_the_agreed_prefix_and_generates_as_if_uncached(tiny_model: nn.Module) -> None:
    prefix_cache = PrefixCache(tiny_model, 1 << 30)
    first = random_tokens(40, seed=1)
    generated, _ = run_turn(prefix_cache, tiny_model, first, max_tokens=4)
    second = [*first, *generated, *random_tokens(10, seed=2)]
    lease = prefix_cache.acquire(second)
    assert lease.cached_tokens > 20
    shorter = prefix_cache.shorten(lease, 20)
    assert (shorter.cached_tokens, held_token_count(shorter.cache)) == (20, 20)
    assert shorter.remaining_tokens == second[20:]
    assert greedy(tiny_model, shorter.remaining_tokens, shorter.cache, 8) == greedy_uncached(tiny_model, second, 8)
    prefix_cache.discard(shorter)


def test_shortening_to_nothing_gives_an_empty_cache_and_never_grows(tiny_model: nn.Module) -> None:
    prefix_cache = PrefixCache(tiny_model, 1 << 30)
    prompt = random_tokens(30, seed=3)
    run_turn(prefix_cache, tiny_model, prompt, max_tokens=2)
    lease = prefix_cache.acquire([*prompt, 7])
    emptied = prefix_cache.shorten(lease, 0)
    assert (emptied.cached_tokens, held_token_count(emptied.cache)) == (0, 0)
    with pytest.raises(ValueError, match="cannot grow"):
        prefix_cache.shorten(emptied, 5)
    assert prefix_cache.shorten(emptied, 0) is emptied
    prefix_cache.discard(emptied)
