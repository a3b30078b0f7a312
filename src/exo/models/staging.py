"""Atomic creation of model directories: build in a temp dir beside the target, then rename.

Temp dirs are named `.staging-<target name>-<pid>-<random>`. A process killed mid-download or mid-import cannot
delete its own, so the next process preparing the same target removes those whose process is gone. The same scratch
folders serve other work a process can be killed in (a pipeline rank's hostfile while it joins its ring).
"""

import logging
import os
import re
import shutil
import tempfile
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path

logger = logging.getLogger(__name__)

STAGING_PREFIX = ".staging-"
_OWNED_SUFFIX = re.compile(r"(?P<pid>\d+)-[a-z0-9_]+")


def _make_readable(directory: Path) -> None:
    # mkdtemp creates 0700 and some writers use 0600; a shared model cache should be readable like any download.
    directory.chmod(0o755)
    for entry in directory.rglob("*"):
        entry.chmod(0o755 if entry.is_dir() else 0o644)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, it is just not ours
    return True


def remove_abandoned_scratch(parent: Path, label: str) -> list[Path]:
    """Delete `parent`'s scratch dirs for `label` whose creating process has exited; return what was removed."""
    stem = f"{STAGING_PREFIX}{label}-"
    removed: list[Path] = []
    for entry in parent.glob(f"{stem}*"):
        # "<pid>-<mkdtemp suffix>" exactly: ".staging-m-2-…" belongs to target "m-2", not to "m".
        owner = _OWNED_SUFFIX.fullmatch(entry.name.removeprefix(stem))
        if entry.is_dir() and owner and not _process_alive(int(owner["pid"])):
            logger.info("removing %s, left by a process that ended before cleaning up", entry)
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


@contextmanager
def scratch_directory(parent: Path, label: str) -> Generator[Path]:
    """Yield a new empty dir inside `parent` for work on `label`; it is deleted when the block ends, however it ends.

    Scratch dirs that earlier, killed processes left for the same `label` are removed first.
    """
    parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned_scratch(parent, label)
    scratch = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{label}-{os.getpid()}-", dir=parent))
    try:
        yield scratch
    finally:
        if scratch.exists():
            shutil.rmtree(scratch, ignore_errors=True)


@contextmanager
def staged_directory(final_dir: Path) -> Generator[Path]:
    """Yield an empty temp directory; on success it becomes `final_dir`, on any error it is deleted.

    The temp dir lives inside `final_dir.parent` so the closing rename stays on one filesystem and is atomic:
    readers see either no directory or a complete one. If another process finished the same target first,
    its copy wins and ours is discarded (both are equivalent).
    """
    with scratch_directory(final_dir.parent, final_dir.name) as staging:
        yield staging
        _make_readable(staging)
        try:
            staging.rename(final_dir)
        except OSError:
            if not final_dir.is_dir():
                raise
            logger.info("%s was created concurrently; keeping that copy", final_dir)
