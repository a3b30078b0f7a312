"""Atomic creation of model directories: build in a temp dir beside the target, then rename."""

import logging
import shutil
import tempfile
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path

logger = logging.getLogger(__name__)

STAGING_PREFIX = ".staging-"


def _make_readable(directory: Path) -> None:
    # mkdtemp creates 0700 and some writers use 0600; a shared model cache should be readable like any download.
    directory.chmod(0o755)
    for entry in directory.rglob("*"):
        entry.chmod(0o755 if entry.is_dir() else 0o644)


@contextmanager
def staged_directory(final_dir: Path) -> Generator[Path]:
    """Yield an empty temp directory; on success it becomes `final_dir`, on any error it is deleted.

    The temp dir lives inside `final_dir.parent` so the closing rename stays on one filesystem and is atomic:
    readers see either no directory or a complete one. If another process finished the same target first,
    its copy wins and ours is discarded (both are equivalent).
    """
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{final_dir.name}-", dir=final_dir.parent))
    try:
        yield staging
        _make_readable(staging)
        try:
            staging.rename(final_dir)
        except OSError:
            if not final_dir.is_dir():
                raise
            logger.info("%s was created concurrently; keeping that copy", final_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
