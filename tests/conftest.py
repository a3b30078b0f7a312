"""Marks the end-to-end tests `slow`, so that `uv run pytest -m "not slow"` runs a fast subset while developing.

A module is end-to-end when its tests start real processes that take seconds each to come up: exo nodes (through
`tests/exo_server.py`), clusters of them, runner subprocesses, or the real coding-agent clients. They are listed
here in one place (glob patterns relative to tests/) rather than marked file by file; a module may also mark
itself with `pytestmark = pytest.mark.slow`. `uv run pytest` still runs everything, as CI does.

Under EXO_STRICT_SKIPS=1 (`.ci/run` sets it) a skip for a reason of the machine (tests/machine_skips.py) fails.
"""

from collections.abc import Generator
from fnmatch import fnmatch
from pathlib import Path

import pytest
from pluggy import Result

from tests.machine_skips import STRICT_VARIABLE, is_machine_skip, strict

pytest_plugins = ["pytester"]  # tests/test_machine_skips.py runs pytest on tests of its own

TESTS = Path(__file__).resolve().parent

END_TO_END: tuple[str, ...] = (
    "api/test_*_end_to_end.py",
    "api/test_api_process.py",
    "api/test_bad_requests.py",
    "api/test_concurrency.py",
    "api/test_hostile_requests.py",
    "api/test_long_prefill_streams.py",
    "api/test_read_timeouts.py",
    "api/test_runner_memory_metrics.py",
    "api/test_security.py",
    "clients/test_*.py",
    "cluster/test_cluster_*.py",
    "dashboard/test_dashboard_browser.py",
    "examples/test_*_end_to_end.py",
    "mcp/test_mcp_*.py",
    "test_main.py",
    "worker/test_runner_*.py",
    "worker/runner/test_pipeline_*.py",
    "worker/runner/test_runner*.py",
    "worker/runner/test_supervisor_dispatch.py",
    "worker/runner/test_idle_refinement.py",
    "worker/runner/test_model_description.py",
    "worker/runner/test_memory_report.py",
)


def end_to_end(path: Path) -> bool:
    relative = path.resolve().relative_to(TESTS).as_posix()
    return any(fnmatch(relative, pattern) for pattern in END_TO_END)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if end_to_end(item.path):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport() -> Generator[None, Result[pytest.TestReport]]:
    outcome = yield
    report = outcome.get_result()
    if report.skipped and strict() and is_machine_skip(skip_message(report)):
        report.outcome = "failed"
        report.longrepr = f"{STRICT_VARIABLE}=1: a skip for a reason of the machine fails: {skip_message(report)}"


def skip_message(report: pytest.TestReport) -> str:
    """The message of a skipped test's report ("Skipped: ..." as pytest writes it)."""
    longrepr: object = report.longrepr
    if isinstance(longrepr, tuple):
        return str(longrepr[-1])  # pyright: ignore[reportUnknownArgumentType]
    return str(longrepr)
