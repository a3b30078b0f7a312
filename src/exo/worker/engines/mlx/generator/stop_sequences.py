"""Client stop sequences: cut the text at the first match, holding back only what could still become one."""

from collections.abc import Sequence


class StopSequenceMatcher:
    """Fed text incrementally; returns what is safe to pass on and whether a stop sequence was hit."""

    def __init__(self, stop_sequences: Sequence[str]) -> None:
        self._stops = [stop for stop in stop_sequences if stop]
        self._longest = max((len(stop) for stop in self._stops), default=0)
        self._pending = ""
        self.stopped = False
        # The stop sequence found first in the text (the longest of those starting at the same place).
        self.matched: str | None = None

    def feed(self, text: str) -> str:
        if not self._stops:
            return text
        if self.stopped:
            return ""
        window = self._pending + text
        found = [(position, -len(stop), stop) for stop in self._stops if (position := window.find(stop)) >= 0]
        if found:
            cut, _, self.matched = min(found)
            self.stopped = True
            self._pending = ""
            return window[:cut]
        keep = self._held_suffix_length(window)
        self._pending = window[len(window) - keep :] if keep else ""
        return window[: len(window) - keep]

    def flush(self) -> str:
        pending, self._pending = self._pending, ""
        return "" if self.stopped else pending

    def _held_suffix_length(self, window: str) -> int:
        """Length of the longest suffix of `window` that is a proper prefix of some stop sequence."""
        for length in range(min(self._longest - 1, len(window)), 0, -1):
            suffix = window[-length:]
            if any(stop.startswith(suffix) for stop in self._stops):
                return length
        return 0
