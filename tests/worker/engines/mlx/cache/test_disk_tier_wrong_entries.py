"""Whatever is found under a snapshot's names in the disk tier, the prompt is served by prefill with the cold output,
the entry is removed, and the next start of the tier is clean.

On main 0b66627 a snapshot replaced by a directory failed every request sharing its prefix, after every restart: the
size check called it truncated, and deleting it raised IsADirectoryError. The cases are every kind of entry a
snapshot's data file or its record can turn into, met either when the tier starts (its scan) or while it runs (a
request's load).
"""

import json
import logging
import os
import shutil
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
from mlx import nn

from exo.worker.engines.mlx.cache import PrefixCache
from tests.worker.engines.mlx.cache.conftest import (
    NEW_TOKENS,
    SYSTEM_PROMPT,
    UNLIMITED,
    greedy_uncached,
    run_turn,
    session_prompt,
    tiny_disk_tier,
)

IS_ROOT = os.geteuid() == 0


def _tier(directory: Path, model: nn.Module) -> PrefixCache:
    return PrefixCache(model, UNLIMITED, tiny_disk_tier(directory, model))


def _one_snapshot(model: nn.Module, directory: Path) -> tuple[Path, Path]:
    """Leave one snapshot of session 1 in `directory`: its data file and its record."""
    before = _tier(directory, model)
    run_turn(before, model, session_prompt(1), NEW_TOKENS)
    while before.snapshots_pending:
        before.write_pending_snapshot()
    (data_file,) = directory.glob("*.safetensors")
    return data_file, data_file.with_suffix(".json")


def _directory_with_contents(path: Path) -> None:
    path.unlink()
    path.mkdir()
    (path / "inside").write_bytes(b"x" * 100)
    (path / "nested").mkdir()


def _empty_directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _link_to_a_directory(path: Path) -> None:
    target = path.parent.parent / f"elsewhere-{path.name}"
    target.mkdir()
    path.unlink()
    path.symlink_to(target, target_is_directory=True)


def _link_to_an_intact_copy(path: Path) -> None:
    # The bytes behind the link are the very snapshot: still not a file the tier wrote, so not trusted.
    target = path.parent.parent / f"copy-{path.name}"
    shutil.copyfile(path, target)
    path.unlink()
    path.symlink_to(target)


def _dangling_link(path: Path) -> None:
    path.unlink()
    path.symlink_to(path.parent / "nothing-here")


def _named_pipe(path: Path) -> None:
    # Read, a pipe with no writer blocks forever: the runner would hang, not fail.
    path.unlink()
    os.mkfifo(path)


def _socket(path: Path) -> None:
    path.unlink()
    listener = socket.socket(socket.AF_UNIX)
    working_directory = Path.cwd()
    os.chdir(path.parent)  # bound by its short relative name: a socket's whole path must fit in 108 bytes
    try:
        listener.bind(path.name)
    finally:
        os.chdir(working_directory)
        listener.close()


def _no_permissions(path: Path) -> None:
    path.chmod(0)


def _truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _garbage_of_the_same_size(path: Path) -> None:
    path.write_bytes(os.urandom(path.stat().st_size))  # (a record's bytes are not even UTF-8 then)


def _empty_file(path: Path) -> None:
    path.write_bytes(b"")


WRONG_KINDS: dict[str, Callable[[Path], None]] = {
    "a directory with contents": _directory_with_contents,
    "an empty directory": _empty_directory,
    "a link to a directory": _link_to_a_directory,
    "a link to an intact copy": _link_to_an_intact_copy,
    "a dangling link": _dangling_link,
    "a named pipe": _named_pipe,
    "a socket": _socket,
    "a file without permissions": _no_permissions,
    "a truncated file": _truncated,
    "garbage of the same size": _garbage_of_the_same_size,
    "an empty file": _empty_file,
}


def _assert_served_cold_and_clean(
    model: nn.Module, directory: Path, restarted: PrefixCache, *, readable_anyway: bool
) -> None:
    generated, lease = run_turn(restarted, model, session_prompt(2), NEW_TOKENS)

    assert generated == greedy_uncached(model, session_prompt(2), NEW_TOKENS)
    if readable_anyway:
        # Root reads a file whatever its mode: the snapshot is intact, so it serves.
        assert lease.disk_cached_tokens == len(SYSTEM_PROMPT)
        return
    assert lease.cached_tokens == 0
    assert sorted(path.name for path in directory.iterdir()) == [], "the wrong entry is removed, whatever its kind"
    # A later start finds nothing wrong, and the next snapshot of the prompt is written and served again.
    again = _tier(directory, model)
    run_turn(again, model, session_prompt(3), NEW_TOKENS)
    while again.snapshots_pending:
        again.write_pending_snapshot()
    _, lease = run_turn(_tier(directory, model), model, session_prompt(4), NEW_TOKENS)
    assert lease.disk_cached_tokens == len(SYSTEM_PROMPT)


@pytest.mark.parametrize("when", ["found at start", "found by a request"])
@pytest.mark.parametrize("kind", list(WRONG_KINDS))
def test_a_snapshot_data_file_of_any_wrong_kind_is_removed_and_the_prompt_prefilled(
    tiny_model: nn.Module, tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str, when: str
) -> None:
    caplog.set_level(logging.WARNING)
    directory = tmp_path / "tier"
    data_file, _ = _one_snapshot(tiny_model, directory)
    if when == "found at start":
        WRONG_KINDS[kind](data_file)
        restarted = _tier(directory, tiny_model)
    else:
        restarted = _tier(directory, tiny_model)
        WRONG_KINDS[kind](data_file)

    readable_anyway = IS_ROOT and kind == "a file without permissions"
    _assert_served_cold_and_clean(tiny_model, directory, restarted, readable_anyway=readable_anyway)
    if not readable_anyway:
        assert any("dropping" in record.message for record in caplog.records)


def _with_first_token(token: int) -> Callable[[Path], None]:
    def rewrite(path: Path) -> None:
        record = json.loads(path.read_text())
        record["tokens"][0] = token
        path.write_text(json.dumps(record))

    return rewrite


RECORD_KINDS: dict[str, Callable[[Path], None]] = {
    "a directory with contents": _directory_with_contents,
    "a link to a directory": _link_to_a_directory,
    "a dangling link": _dangling_link,
    "a named pipe": _named_pipe,
    "a file without permissions": _no_permissions,
    "a truncated file": _truncated,
    "garbage": _garbage_of_the_same_size,
    "an empty file": _empty_file,
    "a token id past 32 bits": _with_first_token(2**40),
    "a negative token id": _with_first_token(-1),
}


@pytest.mark.parametrize("kind", list(RECORD_KINDS))
def test_a_snapshot_record_of_any_wrong_kind_is_removed_with_its_data_at_start(
    tiny_model: nn.Module, tmp_path: Path, kind: str
) -> None:
    directory = tmp_path / "tier"
    _, record = _one_snapshot(tiny_model, directory)
    RECORD_KINDS[kind](record)

    restarted = _tier(directory, tiny_model)

    readable_anyway = IS_ROOT and kind == "a file without permissions"
    _assert_served_cold_and_clean(tiny_model, directory, restarted, readable_anyway=readable_anyway)


def test_a_wrong_entry_that_cannot_be_removed_is_left_alone_and_never_read(
    tiny_model: nn.Module, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.WARNING)
    directory = tmp_path / "tier"
    data_file, _ = _one_snapshot(tiny_model, directory)
    restarted = _tier(directory, tiny_model)
    _directory_with_contents(data_file)

    def refuse(path: str, *_arguments: object, **_keywords: object) -> None:
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(shutil, "rmtree", refuse)  # as a read-only mount would
    for session in (2, 3):
        generated, lease = run_turn(restarted, tiny_model, session_prompt(session), NEW_TOKENS)
        assert lease.disk_cached_tokens == 0
        assert generated == greedy_uncached(tiny_model, session_prompt(session), NEW_TOKENS)

    assert data_file.is_dir()
    assert any("cannot remove" in record.message for record in caplog.records)
    assert sum("dropping" in record.message for record in caplog.records) == 1, "tried once, then forgotten"
