"""Counts the characters the parser's scanners examine, so tests can prove the work is linear in the input."""


class WorkMeter:
    """A running total of characters examined; every scanner adds what it looks at."""

    def __init__(self) -> None:
        self.chars_examined = 0

    def touch(self, count: int) -> None:
        self.chars_examined += count
