"""PrefixCache: reused prefixes give exactly the uncached output, reuse is reported, memory stays in budget."""

import mlx.core as mx
import pytest
from mlx import nn

from exo.worker.engines.mlx.cache import PrefixCache
from exo.worker.engines.mlx.cache.layer_cache import held_token_count
from exo.worker.engines.mlx.step_clock import STEP_CLOCK
from tests.worker.engines.mlx.cache.conftest import (
    NEW_TOKENS,
    UNLIMITED,
    greedy,
    greedy_uncached,
    random_tokens,
    run_turn,
)


def test_empty_store_reuses_nothing_and_prefills_the_whole_prompt(tiny_model: nn.Module) -> None:
    prefix_cache = PrefixCache(tiny_model, UNLIMITED)
    prompt = random_tokens(30, seed=1)

    generated, lease = run_turn(prefix_cache, tiny_model, prompt, NEW_TOKENS)

    assert lease.cached_tokens == 0
    assert lease.remaining_tokens == prompt
    assert generated == greedy_uncached(tiny_model, prompt, NEW_TOKENS)
    assert prefix_cache.entries == 1
    assert prefix_cache.nbytes > 0


def test_multi_turn_conversation_reuses_previous_turn_and_matches_uncached_output(tiny_model: nn.Module) -> None:
    prefix_cache = PrefixCache(tiny_model, UNLIMITED)
    conversation = random_tokens(40, seed=2)
    previous_turn_length = 0
    for turn in range(4):
        generated, lease = run_turn(prefix_cache, tiny_model, conversation, NEW_TOKENS)

        assert lease.cached_tokens == previous_turn_length
        assert generated == greedy_uncached(tiny_model, conversation, NEW_TOKENS)
        # The next turn resends everything so far (prompt + this answer) plus a new user message.
        conversation = [*conversation, *generated]
        previous_turn_length = len(conversation)
        conversation = [*conversation, *random_tokens(15, seed=100 + turn)]
    # Each turn's entry extends the previous one, which is then redundant and dropped.
    assert prefix_cache.entries == 1


def test_prompt_diverging_mid_way_reuses_only_the_shared_part(tiny_model: nn.Module) -> None:
    prefix_cache = PrefixCache(tiny_model, UNLIMITED)
    first = random_tokens(60, seed=3)
    run_turn(prefix_cache, tiny_model, first, NEW_TOKENS)
    diverged = [*first[:30], *[(token + 1) % 256 for token in first[30:]]]

    generated, lease = run_turn(prefix_cache, tiny_model, diverged, NEW_TOKENS)

    assert lease.cached_tokens == 30
    assert generated == greedy_uncached(tiny_model, diverged, NEW_TOKENS)
    # The original entry survives the trimmed copy made from it: both branches stay reusable.
    generated_again, lease_again = run_turn(prefix_cache, tiny_model, first, NEW_TOKENS)
    assert lease_again.cached_tokens == len(first) - 1
    assert generated_again == greedy_uncached(tiny_model, first, NEW_TOKENS)


def test_identical_prompt_reuses_all_but_the_last_token(tiny_model: nn.Module) -> None:
    prefix_cache = PrefixCache(tiny_model, UNLIMITED)
    prompt = random_tokens(35, seed=4)
    lease = prefix_cache.acquire(prompt)
    greedy(tiny_model, lease.remaining_tokens, lease.cache, NEW_TOKENS)
    prefix_cache.release(lease, prompt)  # stored under exactly the prompt (the generated part trimmed away)

    generated, repeat = run_turn(prefix_cache, tiny_model, prompt, NEW_TOKENS)

    assert repeat.cached_tokens == len(prompt) - 1
    assert repeat.remaining_tokens == [prompt[-1]]
    assert generated == greedy_uncached(tiny_model, prompt, NEW_TOKENS)


def test_prompt_that_is_a_strict_prefix_of_a_cached_one_is_served_by_trimming(tiny_model: nn.Module) -> None:
    prefix_cache = PrefixCache(tiny_model, UNLIMITED)
    long_prompt = random_tokens(50, seed=5)
    run_turn(prefix_cache, tiny_model, long_prompt, NEW_TOKENS)
    short_prompt = long_prompt[:25]

    generated, lease = run_turn(prefix_cache, tiny_model, short_prompt, NEW_TOKENS)

    assert lease.cached_tokens == len(short_prompt) - 1
    assert generated == greedy_uncached(tiny_model, short_prompt, NEW_TOKENS)


def test_release_trims_a_cache_that_holds_more_than_the_given_tokens(tiny_model: nn.Module) -> None:
    prefix_cache = PrefixCache(tiny_model, UNLIMITED)
    prompt = random_tokens(30, seed=6)
    lease = prefix_cache.acquire(prompt)
    greedy(tiny_model, lease.remaining_tokens, lease.cache, NEW_TOKENS)
    assert held_token_count(lease.cache) == len(prompt) + NEW_TOKENS

    prefix_cache.release(lease, prompt)

    follow_up = [*prompt, *random_tokens(10, seed=7)]
    generated, reuse = run_turn(prefix_cache, tiny_model, follow_up, NEW_TOKENS)
    assert reuse.cached_tokens == len(prompt)
    assert generated == greedy_uncached(tiny_model, follow_up, NEW_TOKENS)


def test_release_files_the_cache_under_only_the_tokens_it_really_holds(tiny_model: nn.Module) -> None:
    prefix_cache = PrefixCache(tiny_model, UNLIMITED)
    prompt = random_tokens(30, seed=8)
    lease = prefix_cache.acquire(prompt)
    generated = greedy(tiny_model, lease.remaining_tokens, lease.cache, NEW_TOKENS)
    unprocessed = random_tokens(5, seed=9)  # tokens the caller claims but the model never saw

    prefix_cache.release(lease, [*prompt, *generated, *unprocessed])

    follow_up = [*prompt, *generated, *unprocessed, *random_tokens(5, seed=10)]
    output, reuse = run_turn(prefix_cache, tiny_model, follow_up, NEW_TOKENS)
    assert reuse.cached_tokens == len(prompt) + len(generated)
    assert output == greedy_uncached(tiny_model, follow_up, NEW_TOKENS)


def test_release_with_tokens_not_starting_with_the_prompt_stores_nothing(tiny_model: nn.Module) -> None:
    prefix_cache = PrefixCache(tiny_model, UNLIMITED)
    prompt = random_tokens(30, seed=11)
    lease = prefix_cache.acquire(prompt)
    generated = greedy(tiny_model, lease.remaining_tokens, lease.cache, NEW_TOKENS)

    prefix_cache.release(lease, [(prompt[0] + 1) % 256, *prompt[1:], *generated])

    assert prefix_cache.entries == 0
    assert prefix_cache.nbytes == 0


def test_discard_after_a_partial_generation_leaves_the_store_intact(tiny_model: nn.Module) -> None:
    prefix_cache = PrefixCache(tiny_model, UNLIMITED)
    prompt = random_tokens(40, seed=12)
    run_turn(prefix_cache, tiny_model, prompt, NEW_TOKENS)
    entries, nbytes = prefix_cache.entries, prefix_cache.nbytes
    # A generation that trims the leased copy and writes different tokens into it, then fails.
    lease = prefix_cache.acquire([*prompt[:20], *random_tokens(30, seed=13)])
    greedy(tiny_model, lease.remaining_tokens, lease.cache, NEW_TOKENS)

    prefix_cache.discard(lease)

    assert (prefix_cache.entries, prefix_cache.nbytes) == (entries, nbytes)
    generated, reuse = run_turn(prefix_cache, tiny_model, prompt, NEW_TOKENS)
    assert reuse.cached_tokens == len(prompt) - 1
    assert generated == greedy_uncached(tiny_model, prompt, NEW_TOKENS)


def test_a_lease_can_be_ended_only_once(tiny_model: nn.Module) -> None:
    prefix_cache = PrefixCache(tiny_model, UNLIMITED)
    prompt = random_tokens(10, seed=14)
    lease = prefix_cache.acquire(prompt)
    prefix_cache.discard(lease)

    with pytest.raises(ValueError, match="not outstanding"):
        prefix_cache.release(lease, prompt)


def test_empty_prompt_is_rejected(tiny_model: nn.Module) -> None:
    with pytest.raises(ValueError, match="empty"):
        PrefixCache(tiny_model, UNLIMITED).acquire([])


def _entry_size(model: nn.Module) -> int:
    probe = PrefixCache(model, UNLIMITED)
    run_turn(probe, model, random_tokens(20, seed=15), NEW_TOKENS)
    return probe.nbytes


def _distinct_prompt(first_token: int, seed: int) -> list[int]:
    """Prompts with different first tokens share no prefix, so each becomes its own entry."""
    return [first_token, *random_tokens(19, seed=seed)]


def test_memory_budget_holds_after_every_release_and_evicts_least_recently_stored(tiny_model: nn.Module) -> None:
    entry_size = _entry_size(tiny_model)
    budget = entry_size * 2 + entry_size // 2
    prefix_cache = PrefixCache(tiny_model, budget)
    first, second, third = (_distinct_prompt(token, seed=20 + token) for token in (1, 2, 3))

    for prompt in (first, second):
        run_turn(prefix_cache, tiny_model, prompt, NEW_TOKENS)
        assert prefix_cache.nbytes <= budget
    assert prefix_cache.entries == 2
    # Using `first` again makes it the most recent, so `second` is the one to go when `third` arrives.
    generated, _ = run_turn(prefix_cache, tiny_model, first, NEW_TOKENS)
    run_turn(prefix_cache, tiny_model, third, NEW_TOKENS)

    assert prefix_cache.nbytes <= budget
    assert prefix_cache.entries == 2
    evicted = prefix_cache.acquire(second)
    kept = prefix_cache.acquire([*first, *generated])
    assert evicted.cached_tokens == 0
    assert kept.cached_tokens > 0


def test_entry_larger_than_the_whole_budget_is_not_kept(tiny_model: nn.Module) -> None:
    prefix_cache = PrefixCache(tiny_model, _entry_size(tiny_model) - 1)

    run_turn(prefix_cache, tiny_model, random_tokens(20, seed=30), NEW_TOKENS)

    assert prefix_cache.entries == 0
    assert prefix_cache.nbytes == 0


def test_release_counts_evaluating_the_cache_as_waiting_for_the_device(tiny_model: nn.Module) -> None:
    prefix_cache = PrefixCache(tiny_model, UNLIMITED)
    prompt = random_tokens(30, seed=20)
    lease = prefix_cache.acquire(prompt)
    generated = greedy(tiny_model, lease.remaining_tokens, lease.cache, NEW_TOKENS)
    tiny_model(mx.array([generated[-1:]]), cache=lease.cache)  # a step left unevaluated, as one in flight is
    STEP_CLOCK.begin()

    prefix_cache.release(lease, [*prompt, *generated])

    _, parts = STEP_CLOCK.end()
    assert parts.get("device", 0.0) > 0.0  # the host-overhead meter does not count the wait as host work
    assert prefix_cache.entries == 1
