"""What the real-client tests share: the installed opencode binary."""

from pathlib import Path

import pytest

from tests.clients.installed import require_client


@pytest.fixture(scope="module")
def opencode() -> Path:
    return require_client("opencode")
