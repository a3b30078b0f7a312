"""Tokens per second now: the tokens a runner generated over the last few seconds, counted as they are produced
(each step's running count, see task_replies.py), not when a request ends."""

import time
from collections import deque
from collections.abc import Callable

WINDOW_SECONDS = 5.0


class TokenRate:
    def __init__(self, window_seconds: float = WINDOW_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self._window = window_seconds
        self._clock = clock
        self._counts: deque[tuple[float, int]] = deque()

    def add(self, tokens: int) -> None:
        if tokens > 0:
            self._counts.append((self._clock(), tokens))

    def per_second(self) -> float:
        """Tokens generated within the window, over the window's length."""
        since = self._clock() - self._window
        while self._counts and self._counts[0][0] < since:
            self._counts.popleft()
        return sum(tokens for _, tokens in self._counts) / self._window
