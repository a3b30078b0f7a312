"""staged_directory: the target appears whole or not at all."""

import stat
from pathlib import Path

import pytest

from exo.models.staging import staged_directory


def test_success_renames_staging_into_place_readably(tmp_path: Path) -> None:
    target = tmp_path / "models" / "m"
    with staged_directory(target) as staging:
        (staging / "weights.bin").write_bytes(b"w")
        assert not target.exists()
    assert (target / "weights.bin").read_bytes() == b"w"
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert stat.S_IMODE((target / "weights.bin").stat().st_mode) == 0o644
    assert [entry.name for entry in target.parent.iterdir()] == ["m"]


def _fail_midway(target: Path) -> None:
    with staged_directory(target) as staging:
        (staging / "half-written.bin").write_bytes(b"partial")
        raise RuntimeError("conversion broke")


def test_failure_leaves_nothing_behind(tmp_path: Path) -> None:
    target = tmp_path / "models" / "m"
    with pytest.raises(RuntimeError, match="conversion broke"):
        _fail_midway(target)
    assert list(target.parent.iterdir()) == []


def test_concurrent_finisher_wins_and_our_copy_is_discarded(tmp_path: Path) -> None:
    target = tmp_path / "models" / "m"
    with staged_directory(target) as staging:
        (staging / "ours.bin").write_bytes(b"ours")
        target.mkdir()
        (target / "theirs.bin").write_bytes(b"theirs")
    assert [entry.name for entry in target.iterdir()] == ["theirs.bin"]
    assert [entry.name for entry in target.parent.iterdir()] == ["m"]
