"""Markdown helpers shared by the report's sections."""

import re
from pathlib import PurePosixPath

_ABSOLUTE_PATH = re.compile(r"(?<![\w~.:/])/[^\s`'\"()|,;]+")


def without_directories(text: str) -> str:
    """`text` with every absolute path cut to its last part (`/root/.venv/lib/libmkl_rt.so.3` → `libmkl_rt.so.3`):
    a published report names what was used, not where it lay on the machine that measured it."""
    return _ABSOLUTE_PATH.sub(lambda found: PurePosixPath(found.group(0)).name or found.group(0), text)


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A pipe table's lines, followed by a blank line."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [*lines, ""]
