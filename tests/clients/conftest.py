"""What the real-client tests share: the installed opencode binary, and the pinned clients installed before the
first test that needs them (marked `npm_clients`) starts its clock."""

from collections.abc import Generator
from pathlib import Path

import pytest

from tests.clients.installed import INSTALLER, require_client


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None]:
    # Outside pytest-timeout's wrapper (tryfirst: this one runs first), so that a first install taking minutes does
    # not count against the test's own timeout. A failed install is reported by `require_client`, in the test.
    if item.get_closest_marker("npm_clients") is not None:
        INSTALLER.ensure_installed()
    yield


@pytest.fixture(scope="module")
def opencode() -> Path:
    return require_client("opencode")
