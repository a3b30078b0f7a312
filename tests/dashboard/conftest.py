"""The dashboard's browser tests share one headless chromium per module, and a fresh console watch per test; the
pages a test opened are closed when it ends (left open, each would go on polling its node every second beside the
tests that follow)."""

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


@pytest.fixture(autouse=True)
def close_pages(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    launched = getattr(request.node, "funcargs", {}).get("browser")
    if isinstance(launched, Browser):
        for context in launched.contexts:
            context.close()
