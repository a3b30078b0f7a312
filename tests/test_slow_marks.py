"""The fast subset (`-m "not slow"`) leaves out every module that starts real nodes, runners or clients, and the
list of end-to-end modules in tests/conftest.py names no module that is gone."""

import re
from fnmatch import fnmatch
from pathlib import Path

from tests.conftest import END_TO_END, TESTS, end_to_end

# What a module calls to start something that takes seconds to come up.
STARTS_PROCESSES = re.compile(r"running_exo\(|LocalCluster\(|RunnerSupervisor\(")


def test_every_module_that_starts_nodes_runners_or_clients_is_marked_slow() -> None:
    unmarked = [
        path.relative_to(TESTS).as_posix()
        for path in TESTS.rglob("test_*.py")
        if path != Path(__file__)
        and STARTS_PROCESSES.search(path.read_text())
        and not end_to_end(path)
        and "pytest.mark.slow" not in path.read_text()
    ]
    assert unmarked == []


def test_every_pattern_names_an_existing_module() -> None:
    modules = [path.relative_to(TESTS).as_posix() for path in TESTS.rglob("test_*.py")]
    assert [pattern for pattern in END_TO_END if not any(fnmatch(module, pattern) for module in modules)] == []
