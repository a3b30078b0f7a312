"""The whole suite end to end: `python -m bench --quick` starts exo and mlx_lm.server and writes a full report."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.charts import CHART_NAMES
from bench.report import SECTION_TITLES

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# A table row holding at least one decimal number, e.g. "| 1 | 244.98 | ...".
NUMERIC_ROW = re.compile(r"^\|.*\b\d+\.\d+\b.*\|$", re.MULTILINE)


def _section(document: str, title: str) -> str:
    start = document.index(title)
    following = document.find("\n## ", start + len(title))
    return document[start : following if following >= 0 else len(document)]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_run_writes_every_section_with_numbers_and_the_charts(tmp_path: Path) -> None:
    output = tmp_path / "docs" / "PERFORMANCE.md"
    completed = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--output", str(output)],
        cwd=REPOSITORY_ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    document = output.read_text()
    for title in ("## Machine", "## Targets", *SECTION_TITLES):
        assert title in document
    for title in SECTION_TITLES:
        assert NUMERIC_ROW.search(_section(document, title)), f"no numeric table row under {title!r}"
    assert re.search(r"\d+ of 9 targets met", document)
    # The concurrency section states what a batched decode step costs here, measured in the same run.
    ceiling = _section(document, "## 4. Concurrent streams").split("Most N streams can give", 1)[1]
    assert NUMERIC_ROW.search(ceiling)
    for name in CHART_NAMES:
        chart = tmp_path / "docs" / "perf" / name
        assert chart.read_bytes().startswith(PNG_SIGNATURE), f"{chart} is not a PNG"
        assert chart.stat().st_size > 1000
        assert f"perf/{name}" in document
