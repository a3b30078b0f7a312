"""Work per character is O(1): count the characters the scanners examine (not time) for big arguments.

The count comes from wrapping the parser's scanners for the test (bench/parser_work.py); the product has no meter.
"""

import json

import pytest

from bench.parser_work import counting_scan_work
from exo.shared.types.chunks import ToolCallArgumentsChunk
from exo.tool_calls import ToolFormatName as Format
from exo.tool_calls import ToolStreamParser
from exo.tool_calls.markers import MarkerScanner

from .support import TOOLS


def _write_call(tool_format: Format, size: int) -> str:
    body = ('def f(x):\n    return x * 2  # "quoted" \\ text\n' * (size // 40 + 1))[:size]
    if tool_format == Format.QWEN3_CODER:
        parameters = f"<parameter=path>\na.py\n</parameter>\n<parameter=content>\n{body}\n</parameter>\n"
        return f"<function=write>\n{parameters}</function>"
    arguments = json.dumps({"path": "a.py", "content": body})
    return f'<tool_call>{{"name": "write", "arguments": {arguments}}}</tool_call>'


def _feed(text: str, piece: int) -> tuple[ToolStreamParser, list[ToolCallArgumentsChunk], int]:
    """Feed `text` in pieces; return the parser, argument chunks, and how much text had been fed at the first one."""
    parser = ToolStreamParser(Format.HERMES if text.startswith("<tool_call>") else Format.QWEN3_CODER, TOOLS)
    fragments: list[ToolCallArgumentsChunk] = []
    fed_at_first = -1
    for start in range(0, len(text), piece):
        for chunk in parser.feed(text[start : start + piece]):
            if isinstance(chunk, ToolCallArgumentsChunk):
                fed_at_first = start + piece if fed_at_first < 0 else fed_at_first
                fragments.append(chunk)
    for chunk in parser.finish():
        if isinstance(chunk, ToolCallArgumentsChunk):
            fragments.append(chunk)
    return parser, fragments, fed_at_first


@pytest.mark.parametrize("tool_format", [Format.HERMES, Format.QWEN3_CODER])
def test_a_100kb_argument_fed_char_by_char_costs_linear_work(tool_format: Format) -> None:
    small, large = _write_call(tool_format, 50_000), _write_call(tool_format, 100_000)
    with counting_scan_work() as small_work:
        _feed(small, 1)
    with counting_scan_work() as large_work:
        _feed(large, 1)
    per_character = large_work.chars_examined / len(large)
    assert per_character < 20, f"{per_character:.1f} characters examined per character fed"
    growth = large_work.chars_examined / small_work.chars_examined
    assert growth < 2.2, f"work grew {growth:.2f}x for 2x input"


@pytest.mark.parametrize("tool_format", [Format.HERMES, Format.QWEN3_CODER])
def test_a_100kb_argument_streams_while_it_is_generated(tool_format: Format) -> None:
    text = _write_call(tool_format, 100_000)
    parser, fragments, fed_at_first = _feed(text, 7)
    assert fed_at_first < 200, "the first argument fragment arrives right after the call starts"
    assert len(fragments) > 10_000, "the content argument arrives in many fragments, not at the end"
    arguments = "".join(fragment.fragment for fragment in fragments)
    assert len(json.loads(arguments)["content"]) == 100_000
    assert parser.failures == []


def test_the_count_sees_a_scanner_that_rereads_what_it_consumed() -> None:
    """The counting wrappers would catch quadratic work: a scanner given the whole text so far at every step is
    counted for every character each time, and the wrappers are gone after the block."""
    original_scan = MarkerScanner.scan
    text = "x" * 2_000
    with counting_scan_work() as linear:
        scanner = MarkerScanner(["<tool_call>"])
        for end in range(1, len(text) + 1):
            scanner.scan(text[:end], end - 1)
    with counting_scan_work() as rereading:
        for end in range(1, len(text) + 1):
            MarkerScanner(["<tool_call>"]).scan(text[:end], 0)
    assert linear.chars_examined <= 2 * len(text)
    assert rereading.chars_examined == len(text) * (len(text) + 1) // 2
    assert MarkerScanner.scan is original_scan
