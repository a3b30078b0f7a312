"""A stopping runner writes its queued prompt snapshots, the latest session's first, within a bounded time, and says
in the log what it left unwritten. On main 0b66627 a clean stop right after a long prompt's answer left only a
half-written file (deleted at the next start), so the restarted node prefilled the whole prompt again."""

import logging
from pathlib import Path

import pytest
from mlx import nn

from exo.worker.engines.mlx.cache import PrefixCache
from exo.worker.engines.mlx.cache.disk_tier import MIN_SNAPSHOT_TOKENS
from exo.worker.runner.idle_snapshots import write_snapshots_before_stopping
from tests.worker.engines.mlx.cache.conftest import UNLIMITED, random_tokens, run_turn, tiny_disk_tier


def _sessions(model: nn.Module, directory: Path, count: int) -> tuple[PrefixCache, list[list[int]]]:
    """`count` unrelated long sessions answered, their snapshots queued and none written yet."""
    prefix_cache = PrefixCache(model, UNLIMITED, tiny_disk_tier(directory, model))
    prompts = [[session, *random_tokens(MIN_SNAPSHOT_TOKENS + 20, seed=1_000 + session)] for session in range(count)]
    for prompt in prompts:
        run_turn(prefix_cache, model, prompt, 4)
    assert prefix_cache.snapshots_pending
    return prefix_cache, prompts


def test_a_stopping_runner_writes_every_queued_snapshot_and_a_restart_serves_them(
    tiny_model: nn.Module, tmp_path: Path
) -> None:
    prefix_cache, prompts = _sessions(tiny_model, tmp_path, 3)

    write_snapshots_before_stopping(prefix_cache)

    assert not prefix_cache.snapshots_pending
    restarted = PrefixCache(tiny_model, UNLIMITED, tiny_disk_tier(tmp_path, tiny_model))
    for prompt in prompts:
        _, lease = run_turn(restarted, tiny_model, [*prompt, 7, 7], 4)
        assert lease.disk_cached_tokens >= len(prompt)


def test_out_of_time_the_latest_session_is_written_and_the_rest_logged(
    tiny_model: nn.Module, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    prefix_cache, prompts = _sessions(tiny_model, tmp_path, 3)

    write_snapshots_before_stopping(prefix_cache, budget_seconds=1e-9)  # time for the write under way only

    assert prefix_cache.snapshots_pending
    assert any("unwritten" in record.message for record in caplog.records)
    restarted = PrefixCache(tiny_model, UNLIMITED, tiny_disk_tier(tmp_path, tiny_model))
    _, latest = run_turn(restarted, tiny_model, [*prompts[-1], 7, 7], 4)
    assert latest.disk_cached_tokens >= len(prompts[-1])
    _, first = run_turn(restarted, tiny_model, [*prompts[0], 7, 7], 4)
    assert first.disk_cached_tokens == 0
