"""Cost of the incremental tool-call parser per streamed segment, for a Hermes call with large arguments."""

import json
import time
from collections.abc import Sequence

from bench.parser_work import counting_scan_work
from bench.results import ParserCost
from exo.shared.types.tool_spec import ToolSpec
from exo.tool_calls import ToolFormatName, ToolStreamParser

_WRITE_TOOL = ToolSpec(
    name="write",
    description="Write a file",
    parameters={
        "type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"],
    },
)
# Source-like text with quotes and backslashes, so the JSON string scanner meets escapes as it would in practice.
_BODY_LINE = 'def f(x):\n    return x * 2  # "quoted" \\ text\n'


def hermes_call(argument_bytes: int) -> str:
    """A Hermes `<tool_call>` whose arguments JSON is `argument_bytes` characters long."""
    overhead = len(json.dumps({"path": "a.py", "content": ""}))
    body = _BODY_LINE * (argument_bytes // len(_BODY_LINE) + 1)
    # Escaping grows the text: trim the body until the encoded arguments have exactly the wanted size or less.
    content_size = argument_bytes - overhead
    arguments = json.dumps({"path": "a.py", "content": body[:content_size]})
    while len(arguments) > argument_bytes:
        content_size -= len(arguments) - argument_bytes
        arguments = json.dumps({"path": "a.py", "content": body[: max(content_size, 0)]})
    padding = "x" * (argument_bytes - len(arguments))  # plain characters encode as themselves: exact size
    arguments = json.dumps({"path": "a.py", "content": body[: max(content_size, 0)] + padding})
    return f'<tool_call>\n{{"name": "write", "arguments": {arguments}}}\n</tool_call>'


def segments_of(text: str, segment_chars: int) -> list[str]:
    """`text` cut into pieces of `segment_chars` characters, about what a tokenizer's detokenizer emits."""
    return [text[start : start + segment_chars] for start in range(0, len(text), segment_chars)]


def parse(segments: Sequence[str]) -> None:
    """Feed every segment to a fresh parser and finish it; raises if the call did not come out whole."""
    parser = ToolStreamParser(ToolFormatName.HERMES, [_WRITE_TOOL])
    for segment in segments:
        parser.feed(segment)
    parser.finish()
    if parser.tool_calls_emitted != 1 or parser.failures:
        raise RuntimeError(f"the parser did not return the call cleanly: {parser.failures}")


def time_parse(segments: Sequence[str]) -> float:
    """Seconds to `parse` the segments."""
    started = time.perf_counter()
    parse(segments)
    return time.perf_counter() - started


def count_parse(segments: Sequence[str]) -> int:
    """The characters the parser's scanners examine to `parse` the segments, counted in a run of its own (the
    counting wrappers would slow a timed one): unlike time, other processes cannot disturb it."""
    with counting_scan_work() as work:
        parse(segments)
    return work.chars_examined


def measure_parser_cost(sizes: Sequence[int], segment_chars: int, repeats: int) -> list[ParserCost]:
    """Best-of-`repeats` µs per segment for each argument size (the best run is the least disturbed one).

    Sizes take turns within each repeat, so a burst of load from other processes does not land on one size only.
    """
    calls = {size: hermes_call(size) for size in sizes}
    segments = {size: segments_of(call, segment_chars) for size, call in calls.items()}
    best = dict.fromkeys(sizes, float("inf"))
    examined = {size: count_parse(segments[size]) for size in sizes}
    for _ in range(repeats):
        for size in sizes:
            best[size] = min(best[size], time_parse(segments[size]))
    return [
        ParserCost(
            argument_bytes=size,
            segments=len(segments[size]),
            microseconds_per_segment=best[size] / len(segments[size]) * 1e6,
            chars_examined_per_char=examined[size] / len(calls[size]),
        )
        for size in sizes
    ]
