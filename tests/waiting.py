"""Waiting in a test for something another thread or process does."""

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    """Return once `condition()` holds; fail the test naming `what` if it does not within `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"waited {seconds:g} s for {what}"
        time.sleep(0.01)
