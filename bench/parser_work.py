"""Count the characters the tool-call parser's scanners examine, by wrapping them for the length of a `with`.

A count, unlike a time, is not disturbed by other work on the CPU: characters examined per character fed, flat
across sizes, shows the parser never re-reads what it consumed. The product carries no meter for this; the three
scanners every format reads through are wrapped here, from the outside, and put back on leaving.
"""

from collections.abc import Generator
from contextlib import ExitStack, contextmanager
from unittest.mock import patch
from weakref import WeakKeyDictionary

from exo.tool_calls.arguments.json_stream import JsonValueStreamer
from exo.tool_calls.arguments.python_literals import BracketTracker
from exo.tool_calls.markers import MarkerScanner, ScanResult


class ScanWork:
    """The running total of characters the scanners examined while counting."""

    def __init__(self) -> None:
        self.chars_examined = 0


@contextmanager
def counting_scan_work() -> Generator[ScanWork]:
    """Within the block, every marker scan, JSON value feed and bracket feed adds the characters it looked at."""
    work = ScanWork()
    held: WeakKeyDictionary[MarkerScanner, int] = WeakKeyDictionary()
    scan, flush = MarkerScanner.scan, MarkerScanner.flush
    json_feed, bracket_feed = JsonValueStreamer.feed, BracketTracker.feed

    def counted_scan(scanner: MarkerScanner, text: str, position: int) -> ScanResult:
        # A scan looks at the suffix it held back last time and the new text; what it holds back now is the part
        # of that window it did not release (nothing, when it found a marker).
        window = held.get(scanner, 0) + len(text) - position
        result = scan(scanner, text, position)
        held[scanner] = window - len(result.released) if result.marker is None else 0
        work.chars_examined += window
        return result

    def counted_flush(scanner: MarkerScanner) -> str:
        held[scanner] = 0
        return flush(scanner)

    def counted_json_feed(streamer: JsonValueStreamer, text: str, position: int) -> int:
        stopped = json_feed(streamer, text, position)
        work.chars_examined += stopped - position
        return stopped

    def counted_bracket_feed(tracker: BracketTracker, text: str, position: int) -> int:
        stopped = bracket_feed(tracker, text, position)
        work.chars_examined += stopped - position
        return stopped

    with ExitStack() as patches:
        patches.enter_context(patch.object(MarkerScanner, "scan", counted_scan))
        patches.enter_context(patch.object(MarkerScanner, "flush", counted_flush))
        patches.enter_context(patch.object(JsonValueStreamer, "feed", counted_json_feed))
        patches.enter_context(patch.object(BracketTracker, "feed", counted_bracket_feed))
        yield work
