"""Find literal markers in a stream of text, holding back only a suffix that could still begin one."""

import re
from collections.abc import Sequence


class ScanResult:
    """What one scan step produced: text that is certainly not a marker, then the marker found (if any)."""

    __slots__ = ("marker", "position", "released")

    def __init__(self, released: str, marker: str | None, position: int) -> None:
        self.released = released
        self.marker = marker
        self.position = position


class MarkerScanner:
    """Incremental search for the leftmost of several markers.

    Text is released as soon as it cannot be part of a marker; a suffix that is a proper prefix of some
    marker is held until the next scan decides it. The held text is at most the longest marker, so each
    scan costs O(new text + longest marker).
    """

    def __init__(self, markers: Sequence[str]) -> None:
        ordered = sorted({marker for marker in markers if marker}, key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(marker) for marker in ordered)) if ordered else None
        self._prefixes = {marker[:length] for marker in ordered for length in range(1, len(marker))}
        self._longest = len(ordered[0]) if ordered else 0
        self._held = ""

    @property
    def holding(self) -> bool:
        return bool(self._held)

    def scan(self, text: str, position: int) -> ScanResult:
        """Consume `text[position:]` up to and including the first marker (or all of it)."""
        held = self._held
        window = held + text[position:] if held else text[position:]
        match = self._pattern.search(window) if self._pattern is not None else None
        if match is not None:
            self._held = ""
            return ScanResult(window[: match.start()], match.group(), position + match.end() - len(held))
        keep = self._partial_suffix_length(window)
        self._held = window[len(window) - keep :] if keep else ""
        return ScanResult(window[: len(window) - keep], None, len(text))

    def flush(self) -> str:
        """End of stream: whatever was held is not a marker after all."""
        held, self._held = self._held, ""
        return held

    def _partial_suffix_length(self, window: str) -> int:
        longest = min(self._longest - 1, len(window))
        for length in range(longest, 0, -1):
            if window[len(window) - length :] in self._prefixes:
                return length
        return 0


class LiteralMatcher:
    """Match one of several literals starting exactly at the current position, char by char across feeds."""

    MATCHED = "matched"
    PENDING = "pending"
    MISMATCH = "mismatch"

    def __init__(self, literals: Sequence[str]) -> None:
        self._literals = tuple(literals)
        self.partial = ""

    def step(self, text: str, position: int) -> tuple[str, int]:
        """Advance over `text[position:]`; return (status, new position).

        On MATCHED the literal is `self.partial`; on MISMATCH the offending character is not consumed and
        `self.partial` holds the characters consumed so far that turned out not to be a literal.
        """
        while position < len(text):
            candidate = self.partial + text[position]
            if candidate in self._literals:
                self.partial = candidate
                return self.MATCHED, position + 1
            if not any(literal.startswith(candidate) for literal in self._literals):
                return self.MISMATCH, position
            self.partial = candidate
            position += 1
        return self.PENDING, position
