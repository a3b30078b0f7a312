"""Disk snapshots written by the tier's writer thread while generation goes on: a runner that is never idle still
persists its sessions, one write at a time, with the same files, outputs and bookkeeping as an idle write."""

import itertools
import logging
import threading
import time
from pathlib import Path

import pytest
from mlx import nn

from exo.worker.engines.mlx.cache import PrefixCache
from exo.worker.engines.mlx.cache import disk_tier as disk_tier_module
from exo.worker.engines.mlx.cache.disk_tier import MIN_SNAPSHOT_TOKENS, DiskTier
from tests.waiting import wait_until
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


def _background_disk(directory: Path, model: nn.Module, above: int = 0) -> DiskTier:
    """A tier whose writer thread takes a snapshot as soon as more than `above` bytes are queued."""
    return tiny_disk_tier(directory, model, write_beside_above=above)


def _settle(disk: DiskTier) -> None:
    """Land background writes as the runner does at its next task end, until none is queued or under way."""

    def settled() -> bool:
        disk.advance_background_writes()
        return not disk.pending

    wait_until(settled, "the writer thread to finish", seconds=30)


class _HeldSave:
    """mlx-lm's save, held until released, so a write stays under way as long as a test needs; records its thread."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.threads: list[str] = []
        self._save = disk_tier_module.save_prompt_cache

    def __call__(self, *arguments: object, **keywords: object) -> None:
        self.threads.append(threading.current_thread().name)
        assert self.release.wait(30)
        self._save(*arguments, **keywords)  # pyright: ignore[reportArgumentType]


@pytest.fixture
def held_save(monkeypatch: pytest.MonkeyPatch) -> _HeldSave:
    held = _HeldSave()
    monkeypatch.setattr(disk_tier_module, "save_prompt_cache", held)
    return held


def test_a_snapshot_is_written_without_an_idle_moment_and_serves_a_restart(
    tiny_model: nn.Module, tmp_path: Path
) -> None:
    disk = _background_disk(tmp_path, tiny_model)
    before = PrefixCache(tiny_model, UNLIMITED, disk)
    run_turn(before, tiny_model, session_prompt(1), NEW_TOKENS)
    # Generation goes on beside the write (the runner never calls write_pending here) with unchanged output.
    other = random_tokens(40, seed=990)
    assert run_turn(before, tiny_model, other, NEW_TOKENS)[0] == greedy_uncached(tiny_model, other, NEW_TOKENS)
    _settle(disk)

    assert disk.written_in_background == 1
    assert disk.entries == 1
    assert disk.queued_bytes == 0
    assert not list(tmp_path.glob("*.partial.safetensors"))
    restarted = PrefixCache(tiny_model, UNLIMITED, _background_disk(tmp_path, tiny_model))
    generated, lease = run_turn(restarted, tiny_model, session_prompt(2), NEW_TOKENS)
    assert lease.disk_cached_tokens == len(SYSTEM_PROMPT)
    assert generated == greedy_uncached(tiny_model, session_prompt(2), NEW_TOKENS)


def test_one_write_at_a_time_on_the_writer_thread_its_bytes_counted_until_it_lands(
    tiny_model: nn.Module, tmp_path: Path, held_save: _HeldSave
) -> None:
    disk = _background_disk(tmp_path, tiny_model)
    prefix_cache = PrefixCache(tiny_model, UNLIMITED, disk)
    run_turn(prefix_cache, tiny_model, session_prompt(1), NEW_TOKENS)
    first_bytes = disk.queued_bytes
    run_turn(prefix_cache, tiny_model, random_tokens(MIN_SNAPSHOT_TOKENS + 10, seed=995), NEW_TOKENS)

    wait_until(lambda: bool(held_save.threads), "a write to start")
    assert held_save.threads == ["snapshot-writer_0"]  # one write under way, on the tier's thread
    assert first_bytes > 0
    assert disk.queued_bytes > first_bytes  # the one under way and the one waiting, both still in memory
    assert disk.entries == 0

    held_save.release.set()
    _settle(disk)
    assert held_save.threads == ["snapshot-writer_0", "snapshot-writer_0"]
    assert disk.written_in_background == 2
    assert disk.entries == 2
    assert disk.queued_bytes == 0
    usage = prefix_cache.usage()
    assert (usage.snapshots_written, usage.snapshots_dropped, usage.queued_bytes) == (2, 0, 0)


def test_an_idle_or_stopping_write_waits_for_the_one_under_way(
    tiny_model: nn.Module, tmp_path: Path, held_save: _HeldSave
) -> None:
    disk = _background_disk(tmp_path, tiny_model)
    prefix_cache = PrefixCache(tiny_model, UNLIMITED, disk)
    run_turn(prefix_cache, tiny_model, session_prompt(1), NEW_TOKENS)
    threading.Timer(0.2, held_save.release.set).start()

    prefix_cache.write_pending_snapshot(newest=True)  # as a stopping runner does

    assert not prefix_cache.snapshots_pending
    assert disk.written_in_background == 1
    assert len(list(tmp_path.glob("*.json"))) == 1


@pytest.mark.parametrize(
    "case",
    list(itertools.product([True, False], [RuntimeError("disk full"), TypeError("an unexpected cache state")])),
    ids=lambda case: f"{'background' if case[0] else 'idle'}-{type(case[1]).__name__}",
)
def test_a_failed_write_of_any_kind_is_logged_and_leaves_nothing(
    tiny_model: nn.Module,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    case: tuple[bool, Exception],
) -> None:
    """A snapshot that cannot be written costs a later prefill, never a request nor the runner: whatever the error,
    in the background (landed at a task's end) or while idle (the runner's loop)."""

    def failing_save(*_arguments: object, **_keywords: object) -> None:
        raise error

    monkeypatch.setattr(disk_tier_module, "save_prompt_cache", failing_save)
    background, error = case
    disk = _background_disk(tmp_path, tiny_model) if background else tiny_disk_tier(tmp_path, tiny_model)
    prefix_cache = PrefixCache(tiny_model, UNLIMITED, disk)
    with caplog.at_level(logging.WARNING):
        run_turn(prefix_cache, tiny_model, session_prompt(1), NEW_TOKENS)
        if background:
            _settle(disk)
        else:
            prefix_cache.write_pending_snapshot()

    assert "cannot write a disk snapshot" in caplog.text
    assert str(error) in caplog.text
    assert disk.entries == 0
    assert disk.written_in_background == 0
    assert not list(tmp_path.iterdir())
    # The memory tier still serves the next session.
    generated, lease = run_turn(prefix_cache, tiny_model, session_prompt(2), NEW_TOKENS)
    assert lease.cached_tokens == len(SYSTEM_PROMPT)
    assert generated == greedy_uncached(tiny_model, session_prompt(2), NEW_TOKENS)


def test_a_short_prompts_end_lands_a_finished_write_and_starts_the_next(
    tiny_model: nn.Module, tmp_path: Path, held_save: _HeldSave
) -> None:
    """Under a load of short requests (none long enough to snapshot) the writes still move on at each task's end."""
    disk = _background_disk(tmp_path, tiny_model)
    prefix_cache = PrefixCache(tiny_model, UNLIMITED, disk)
    run_turn(prefix_cache, tiny_model, session_prompt(1), NEW_TOKENS)
    run_turn(prefix_cache, tiny_model, random_tokens(MIN_SNAPSHOT_TOKENS + 10, seed=996), NEW_TOKENS)
    held_save.release.set()
    # The first write's files are done; it is not landed yet.
    wait_until(lambda: bool(list(tmp_path.glob("*.json"))), "the first write's files")
    time.sleep(0.05)
    assert disk.entries == 0

    short = random_tokens(20, seed=997)
    assert run_turn(prefix_cache, tiny_model, short, NEW_TOKENS)[0] == greedy_uncached(tiny_model, short, NEW_TOKENS)

    assert disk.entries == 1  # landed at the short task's end
    # And the second write started there: nothing else would start it.
    wait_until(lambda: len(held_save.threads) == 2, "the second write to start")


def test_the_writer_thread_waits_until_the_queue_is_over_its_threshold(tiny_model: nn.Module, tmp_path: Path) -> None:
    """Under the threshold a snapshot waits for an idle moment (a session's next turn may replace it unwritten)."""
    probe = _background_disk(tmp_path / "probe", tiny_model, above=UNLIMITED)
    run_turn(PrefixCache(tiny_model, UNLIMITED, probe), tiny_model, session_prompt(1), NEW_TOKENS)
    one_session = probe.queued_bytes
    disk = _background_disk(tmp_path / "tier", tiny_model, above=one_session * 3 // 2)
    prefix_cache = PrefixCache(tiny_model, UNLIMITED, disk)

    run_turn(prefix_cache, tiny_model, session_prompt(1), NEW_TOKENS)
    time.sleep(0.2)
    disk.advance_background_writes()
    assert disk.written_in_background == 0
    assert disk.queued_bytes == one_session

    run_turn(prefix_cache, tiny_model, random_tokens(MIN_SNAPSHOT_TOKENS + 10, seed=998), NEW_TOKENS)  # over it now

    def written() -> bool:
        disk.advance_background_writes()
        return disk.written_in_background > 0

    wait_until(written, "the writer thread to take the oldest snapshot")
    assert disk.entries == 1
    assert disk.queued_bytes < one_session * 3 // 2  # one left for an idle moment
    assert probe.written_in_background == 0  # never over its threshold
