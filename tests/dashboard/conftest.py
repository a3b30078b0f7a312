"""The dashboard's browser tests share one headless chromium per module, and a fresh console watch per test."""

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser

from tests.dashboard.browser import ConsoleWatch, chromium


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def watch() -> ConsoleWatch:
    return ConsoleWatch()
