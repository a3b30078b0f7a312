"""What the real-client tests share: the installed opencode binary."""

from pathlib import Path

import pytest

from tests.clients.opencode_client import find_opencode


@pytest.fixture(scope="module")
def opencode() -> Path:
    binary = find_opencode()
    if binary is None:
        pytest.skip("opencode 1.x not installed (`npm install --prefix build/opencode opencode-ai@1`, as .ci/run does)")
    return binary
