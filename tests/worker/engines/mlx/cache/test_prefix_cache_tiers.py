"""The prefix cache across sessions and restarts: memory bounded by bytes alone, snapshots on disk that a new
process reuses, and snapshots that fail a check rejected without changing any output."""

import logging
import shutil
from pathlib import Path

import mlx.core as mx
import pytest
from mlx import nn

from exo.worker.engines.mlx.cache import PrefixCache
from exo.worker.engines.mlx.cache.disk_tier import MIN_SNAPSHOT_TOKENS, DiskTier
from exo.worker.engines.mlx.cache.layer_cache import new_prompt_cache
from tests.worker.engines.mlx.cache.conftest import (
    NEW_TOKENS,
    SYSTEM_PROMPT,
    TINY_IDENTITY,
    UNLIMITED,
    VOCAB_SIZE,
    greedy_uncached,
    random_tokens,
    run_turn,
    session_prompt,
    tiny_disk_tier,
)


def _write_all(prefix_cache: PrefixCache) -> None:
    while prefix_cache.snapshots_pending:
        prefix_cache.write_pending_snapshot()


def test_memory_holds_more_than_eight_sessions_when_bytes_allow(tiny_model: nn.Module) -> None:
    prefix_cache = PrefixCache(tiny_model, UNLIMITED)
    sessions = [[session, *random_tokens(60, seed=700 + session)] for session in range(12)]  # no shared prefix
    answers = [run_turn(prefix_cache, tiny_model, prompt, NEW_TOKENS)[0] for prompt in sessions]

    assert prefix_cache.entries == 12
    # Every session's next turn still finds its whole history, the first one included.
    for prompt, answer in zip(sessions, answers, strict=True):
        follow_up = [*prompt, *answer, *random_tokens(5, seed=800)]
        generated, lease = run_turn(prefix_cache, tiny_model, follow_up, NEW_TOKENS)
        assert lease.cached_tokens == len(prompt) + len(answer)
        assert generated == greedy_uncached(tiny_model, follow_up, NEW_TOKENS)


def test_a_new_session_reuses_the_system_prompt_of_an_earlier_one(tiny_model: nn.Module) -> None:
    prefix_cache = PrefixCache(tiny_model, UNLIMITED)
    run_turn(prefix_cache, tiny_model, session_prompt(1), NEW_TOKENS)

    generated, lease = run_turn(prefix_cache, tiny_model, session_prompt(2), NEW_TOKENS)

    assert lease.cached_tokens == len(SYSTEM_PROMPT)
    assert lease.disk_cached_tokens == 0
    assert generated == greedy_uncached(tiny_model, session_prompt(2), NEW_TOKENS)


def test_after_a_restart_a_new_session_is_served_from_disk_with_the_cold_output(
    tiny_model: nn.Module, tmp_path: Path
) -> None:
    before = PrefixCache(tiny_model, UNLIMITED, tiny_disk_tier(tmp_path, tiny_model))
    run_turn(before, tiny_model, session_prompt(1), NEW_TOKENS)
    assert before.snapshots_pending
    _write_all(before)
    assert len(list(tmp_path.glob("*.safetensors"))) == 1

    restarted = PrefixCache(tiny_model, UNLIMITED, tiny_disk_tier(tmp_path, tiny_model))
    generated, lease = run_turn(restarted, tiny_model, session_prompt(2), NEW_TOKENS)

    assert lease.cached_tokens == len(SYSTEM_PROMPT)
    assert lease.disk_cached_tokens == len(SYSTEM_PROMPT)
    assert generated == greedy_uncached(tiny_model, session_prompt(2), NEW_TOKENS)


def test_snapshots_waiting_for_an_idle_moment_hold_no_more_than_their_budget(
    tiny_model: nn.Module, tmp_path: Path
) -> None:
    # One session's cache, measured: the queue may hold two and a half of them.
    probe = PrefixCache(tiny_model, UNLIMITED, tiny_disk_tier(tmp_path / "probe", tiny_model))
    run_turn(probe, tiny_model, _unshared_prompt(0), NEW_TOKENS)
    session_bytes = probe.disk_queued_bytes
    assert session_bytes > 0
    disk = tiny_disk_tier(tmp_path / "tier", tiny_model, queue=session_bytes * 5 // 2)
    # A runner under steady load: turn after turn, never idle, so nothing is written.
    busy = PrefixCache(tiny_model, session_bytes, disk)
    for session in range(1, 7):
        run_turn(busy, tiny_model, _unshared_prompt(session), NEW_TOKENS)
        assert busy.disk_queued_bytes <= session_bytes * 5 // 2

    assert disk.dropped_from_queue == 4
    assert busy.usage().snapshots_dropped == 4
    _write_all(busy)
    assert busy.usage().snapshots_written == 2
    # The newest two sessions reached the disk; the oldest were dropped unwritten.
    restarted = PrefixCache(tiny_model, UNLIMITED, tiny_disk_tier(tmp_path / "tier", tiny_model))
    for session, on_disk in ((1, False), (4, False), (5, True), (6, True)):
        _, lease = run_turn(restarted, tiny_model, _unshared_prompt(session), NEW_TOKENS)
        assert (lease.disk_cached_tokens > 0) == on_disk, session


def _unshared_prompt(session: int) -> list[int]:
    """A session sharing no prefix with another's (its own first token), long enough to be snapshotted."""
    return [session, *random_tokens(MIN_SNAPSHOT_TOKENS + 20, seed=900 + session)]


def test_memory_is_preferred_when_it_holds_as_much_as_disk(tiny_model: nn.Module, tmp_path: Path) -> None:
    prefix_cache = PrefixCache(tiny_model, UNLIMITED, tiny_disk_tier(tmp_path, tiny_model))
    run_turn(prefix_cache, tiny_model, session_prompt(1), NEW_TOKENS)
    _write_all(prefix_cache)

    _, lease = run_turn(prefix_cache, tiny_model, session_prompt(2), NEW_TOKENS)

    assert lease.cached_tokens == len(SYSTEM_PROMPT)
    assert lease.disk_cached_tokens == 0


def _snapshot_then_restart(model: nn.Module, directory: Path) -> Path:
    """Leave one snapshot of session 1 in `directory`; returns its data file."""
    before = PrefixCache(model, UNLIMITED, tiny_disk_tier(directory, model))
    run_turn(before, model, session_prompt(1), NEW_TOKENS)
    _write_all(before)
    (data_file,) = directory.glob("*.safetensors")
    return data_file


def _assert_rejected_and_cold(model: nn.Module, directory: Path, caplog: pytest.LogCaptureFixture, reason: str) -> None:
    caplog.set_level(logging.WARNING)
    restarted = PrefixCache(model, UNLIMITED, tiny_disk_tier(directory, model))
    generated, lease = run_turn(restarted, model, session_prompt(2), NEW_TOKENS)

    assert lease.cached_tokens == 0
    assert generated == greedy_uncached(model, session_prompt(2), NEW_TOKENS)
    assert not list(directory.glob("*.safetensors")), "the rejected snapshot is deleted"
    assert any("dropping" in record.message and reason in record.message for record in caplog.records)


def test_a_corrupted_snapshot_is_rejected_and_the_request_still_succeeds(
    tiny_model: nn.Module, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data_file = _snapshot_then_restart(tiny_model, tmp_path)
    contents = bytearray(data_file.read_bytes())
    contents[-100] ^= 0xFF  # inside the last layer's values: parses fine, would give wrong attention
    data_file.write_bytes(bytes(contents))

    _assert_rejected_and_cold(tiny_model, tmp_path, caplog, "checksum mismatch")


def test_a_truncated_snapshot_is_rejected_and_the_request_still_succeeds(
    tiny_model: nn.Module, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data_file = _snapshot_then_restart(tiny_model, tmp_path)
    data_file.write_bytes(data_file.read_bytes()[: data_file.stat().st_size // 2])

    _assert_rejected_and_cold(tiny_model, tmp_path, caplog, "truncated")


def _another_models_snapshot_in_our_folder(tiny_model: nn.Module, tmp_path: Path) -> Path:
    """A snapshot written under another model's identity, copied (its files, checksums intact) into this model's
    folder; returns that folder."""
    other = tmp_path / "other-model"
    foreign = PrefixCache(tiny_model, UNLIMITED, tiny_disk_tier(other, tiny_model, identity="another-model"))
    run_turn(foreign, tiny_model, session_prompt(1), NEW_TOKENS)
    _write_all(foreign)
    ours = tmp_path / "ours"
    shutil.copytree(other, ours)
    return ours


def test_another_models_snapshot_is_rejected_and_the_request_still_succeeds(
    tiny_model: nn.Module, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ours = _another_models_snapshot_in_our_folder(tiny_model, tmp_path)

    _assert_rejected_and_cold(tiny_model, ours, caplog, "another model")
    assert not list(ours.glob("*.json"))


def test_a_snapshot_whose_record_was_rewritten_for_this_model_is_still_rejected(
    tiny_model: nn.Module, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ours = _another_models_snapshot_in_our_folder(tiny_model, tmp_path)
    (record,) = ours.glob("*.json")
    record.write_text(record.read_text().replace("another-model", TINY_IDENTITY))  # the data file still says otherwise

    _assert_rejected_and_cold(tiny_model, ours, caplog, "another model")


def test_the_disk_tier_keeps_within_its_byte_budget_evicting_the_least_recently_used(
    tiny_model: nn.Module, tmp_path: Path
) -> None:
    probe_directory = tmp_path / "probe"
    _snapshot_then_restart(tiny_model, probe_directory)
    (probe_file,) = probe_directory.glob("*.safetensors")
    budget = probe_file.stat().st_size * 5 // 2  # two snapshots of this size fit, three do not
    directory = tmp_path / "bounded"
    prefix_cache = PrefixCache(tiny_model, UNLIMITED, tiny_disk_tier(directory, tiny_model, budget=budget))
    sessions = [[session, *random_tokens(len(session_prompt(0)) - 1, seed=900 + session)] for session in range(4)]

    disk = prefix_cache.disk
    assert disk is not None
    for prompt in sessions:
        run_turn(prefix_cache, tiny_model, prompt, 0)
        _write_all(prefix_cache)
        assert disk.nbytes <= budget
        assert sum(path.stat().st_size for path in directory.glob("*.safetensors")) <= budget

    assert disk.entries == 2
    restarted = PrefixCache(tiny_model, UNLIMITED, tiny_disk_tier(directory, tiny_model, budget=budget))
    assert restarted.acquire(sessions[0]).cached_tokens == 0
    assert restarted.acquire(sessions[3]).disk_cached_tokens == len(sessions[3]) - 1


def test_a_cache_cut_from_a_longer_one_is_stored_at_its_own_size(tiny_model: nn.Module, tmp_path: Path) -> None:
    prefix_cache = PrefixCache(tiny_model, UNLIMITED, tiny_disk_tier(tmp_path, tiny_model))
    long_prompt = random_tokens(1500, seed=1000)
    run_turn(prefix_cache, tiny_model, long_prompt, NEW_TOKENS)
    long_bytes = prefix_cache.nbytes
    # Shares 10 tokens with the long prompt: its cache starts as a trimmed copy of the long one's buffers.
    short_prompt = [*long_prompt[:10], *random_tokens(MIN_SNAPSHOT_TOKENS, seed=1001)]

    generated, lease = run_turn(prefix_cache, tiny_model, short_prompt, NEW_TOKENS)

    assert lease.cached_tokens == 10
    assert generated == greedy_uncached(tiny_model, short_prompt, NEW_TOKENS)
    short_bytes = prefix_cache.nbytes - long_bytes
    assert 0 < short_bytes < long_bytes / 3
    _write_all(prefix_cache)
    sizes = sorted(path.stat().st_size for path in tmp_path.glob("*.safetensors"))
    assert len(sizes) == 2
    assert sizes[0] < sizes[1] / 3


def _snapshot(tier: DiskTier, model: nn.Module, tokens: list[int]) -> None:
    cache = new_prompt_cache(model)
    mx.eval(model(mx.array([tokens]), cache=cache))
    tier.queue(tokens, cache)
    tier.write_pending()


def test_the_snapshot_sharing_the_longest_prefix_is_matched(tiny_model: nn.Module, tmp_path: Path) -> None:
    """Every request compares its prompt with each snapshot on disk (vectorised since it runs per request): the
    longest shared prefix wins, whether the prompt runs past a snapshot, diverges inside it or ends inside it."""
    tier = tiny_disk_tier(tmp_path, tiny_model)
    first, second = session_prompt(1), session_prompt(2)  # the system prompt, then each session's own tokens
    for tokens in (first, second):
        _snapshot(tier, tiny_model, tokens)

    def matched(prompt: list[int]) -> tuple[str, int] | None:
        match = tier.best_match(prompt)
        return None if match is None else (match.key, match.common_tokens)

    keys = [match[0] for match in map(matched, (first, second)) if match is not None]
    assert len(set(keys)) == 2
    first_key, second_key = keys
    assert matched([*first, 5, 6]) == (first_key, len(first))
    assert matched([*second[:-10], (second[-10] + 1) % VOCAB_SIZE]) == (second_key, len(second) - 10)
    assert matched(first[:100]) in ((first_key, 100), (second_key, 100))
    assert matched([(first[0] + 1) % VOCAB_SIZE, *first[1:]]) is None
    assert matched([]) is None
