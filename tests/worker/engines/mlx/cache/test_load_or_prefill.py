"""A disk snapshot is loaded only where this runner measured that loading it costs less than prefilling the tokens
it adds to memory's match; until both costs are measured, it is loaded when it adds at least a measured piece's
worth of tokens."""

import logging
from pathlib import Path

import pytest
from mlx import nn

from exo.worker.engines.mlx.cache import PrefixCache
from exo.worker.engines.mlx.cache.load_or_prefill import (
    MEASURED_PIECE_TOKENS,
    NEWEST_WEIGHT,
    UNMEASURED_MIN_SAVED_TOKENS,
    LoadOrPrefill,
)
from tests.worker.engines.mlx.cache.conftest import (
    NEW_TOKENS,
    SYSTEM_PROMPT,
    UNLIMITED,
    greedy_uncached,
    random_tokens,
    run_turn,
    session_prompt,
    tiny_disk_tier,
)


def test_nothing_is_estimated_until_both_costs_were_measured() -> None:
    rule = LoadOrPrefill()
    rule.prefilled(MEASURED_PIECE_TOKENS - 1, 1.0)  # too short a piece to say what a token costs
    rule.prefilled(100, 0.0)
    rule.loaded(1000, 0.5)
    assert rule.prefill_seconds_per_token is None
    assert rule.estimate(10, 1000) is None

    # Unmeasured: decided by the tokens a load adds alone.
    assert rule.worth_loading(UNMEASURED_MIN_SAVED_TOKENS - 1, 1000) == (False, None)
    assert rule.worth_loading(UNMEASURED_MIN_SAVED_TOKENS, 10**9) == (True, None)

    rule.prefilled(100, 1.0)
    assert rule.worth_loading(UNMEASURED_MIN_SAVED_TOKENS - 1, 1)[0]  # measured: a tiny file for a few tokens
    estimate = rule.estimate(10, 4000)
    assert estimate is not None
    assert estimate.prefill_seconds == pytest.approx(0.1)
    assert estimate.load_seconds == pytest.approx(2.0)
    assert not estimate.worth_loading
    even = rule.estimate(200, 4000)  # as dear either way: the disk's tokens are loaded
    assert even is not None
    assert even.worth_loading


def test_each_cost_is_a_running_average_that_one_outlier_does_not_take_over() -> None:
    rule = LoadOrPrefill()
    rule.prefilled(100, 1.0)
    rule.prefilled(100, 11.0)
    assert rule.prefill_seconds_per_token == pytest.approx(0.01 + NEWEST_WEIGHT * 0.1)
    rule.loaded(1000, 1.0)
    rule.loaded(1000, 0.0)  # not a measurement
    assert rule.load_seconds_per_byte == pytest.approx(0.001)


def _session_one_on_disk_then_session_two_in_memory(model: nn.Module, directory: Path) -> PrefixCache:
    """A restarted runner: session 1's snapshot on disk (loaded for session 2's system prompt, the first load),
    session 2 in memory. Session 1's next turn then finds the system prompt in memory and more of it on disk."""
    before = PrefixCache(model, UNLIMITED, tiny_disk_tier(directory, model))
    run_turn(before, model, session_prompt(1), NEW_TOKENS)
    while before.snapshots_pending:
        before.write_pending_snapshot()
    restarted = PrefixCache(model, UNLIMITED, tiny_disk_tier(directory, model))
    _, lease = run_turn(restarted, model, session_prompt(2), NEW_TOKENS)
    assert lease.disk_cached_tokens == len(SYSTEM_PROMPT)  # nothing measured yet: the disk holds more, it is loaded
    assert restarted.load_or_prefill.load_seconds_per_byte is not None
    assert restarted.usage().snapshots_loaded == 1
    return restarted


def test_a_snapshot_adding_few_tokens_is_passed_over_where_prefill_is_measured_cheaper(
    tiny_model: nn.Module, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    prefix_cache = _session_one_on_disk_then_session_two_in_memory(tiny_model, tmp_path)
    prefix_cache.prefilled(1000, 1e-9)  # an accelerator's prefill, far cheaper than any load measured here
    follow_up = [*session_prompt(1), *random_tokens(5, seed=920)]

    with caplog.at_level(logging.INFO, logger="exo.worker.engines.mlx.cache.prefix_cache"):
        generated, lease = run_turn(prefix_cache, tiny_model, follow_up, NEW_TOKENS)

    assert (lease.cached_tokens, lease.disk_cached_tokens) == (len(SYSTEM_PROMPT), 0)  # memory's match only
    assert generated == greedy_uncached(tiny_model, follow_up, NEW_TOKENS)
    usage = prefix_cache.usage()
    assert (usage.snapshots_loaded, usage.snapshots_passed_over) == (1, 1)
    assert "instead of loading a" in caplog.text


def test_the_same_snapshot_is_loaded_where_prefill_is_measured_dearer(tiny_model: nn.Module, tmp_path: Path) -> None:
    prefix_cache = _session_one_on_disk_then_session_two_in_memory(tiny_model, tmp_path)
    prefix_cache.prefilled(1000, 1000.0)  # a second a token: any load measured here is cheaper
    follow_up = [*session_prompt(1), *random_tokens(5, seed=920)]

    generated, lease = run_turn(prefix_cache, tiny_model, follow_up, NEW_TOKENS)

    assert lease.disk_cached_tokens == lease.cached_tokens == len(session_prompt(1))
    assert generated == greedy_uncached(tiny_model, follow_up, NEW_TOKENS)
    usage = prefix_cache.usage()
    assert (usage.snapshots_loaded, usage.snapshots_passed_over) == (2, 0)


def test_a_fresh_runner_does_not_load_a_snapshot_for_a_few_shared_tokens(tiny_model: nn.Module, tmp_path: Path) -> None:
    before = PrefixCache(tiny_model, UNLIMITED, tiny_disk_tier(tmp_path, tiny_model))
    run_turn(before, tiny_model, session_prompt(1), NEW_TOKENS)
    while before.snapshots_pending:
        before.write_pending_snapshot()
    restarted = PrefixCache(tiny_model, UNLIMITED, tiny_disk_tier(tmp_path, tiny_model))
    # Shares a chat template's opening with the snapshot, as every prompt does, and nothing more.
    prompt = [*SYSTEM_PROMPT[: UNMEASURED_MIN_SAVED_TOKENS - 1], *random_tokens(60, seed=930)]

    generated, lease = run_turn(restarted, tiny_model, prompt, NEW_TOKENS)

    assert (lease.cached_tokens, lease.disk_cached_tokens) == (0, 0)
    assert generated == greedy_uncached(tiny_model, prompt, NEW_TOKENS)
    usage = restarted.usage()
    assert (usage.snapshots_loaded, usage.snapshots_passed_over) == (0, 1)
