"""Shared tools, fixture outputs and invariant checks for the tool-parser tests."""

import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from exo.shared.types.chunks import ParsedChunk, ReasoningChunk, TokenChunk, ToolCallArgumentsChunk, ToolCallChunk
from exo.shared.types.common import ToolCallId
from exo.shared.types.tool_spec import ToolSpec
from exo.tool_calls import ToolFormatName, ToolStreamParser
from tests.tool_calls.chunk_merge import merge_chunks

WEATHER = ToolSpec(
    name="get_weather",
    parameters={
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "metric": {"type": "boolean"},
            "options": {"type": "object"},
        },
        "required": ["city"],
        "additionalProperties": False,
    },
)
WRITE = ToolSpec(
    name="write",
    parameters={
        "type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"],
    },
)
TOOLS = [WEATHER, WRITE]


def counting_ids() -> Callable[[], ToolCallId]:
    """Deterministic ids, so a streamed run and a non-streamed run can be compared chunk for chunk."""
    counter = itertools.count()
    return lambda: ToolCallId(f"call_{next(counter):024d}")


@dataclass(frozen=True)
class Fixture:
    """A model output and what it means."""

    name: str
    tool_format: ToolFormatName
    text: str
    calls: Sequence[tuple[str, Mapping[str, object]]]
    content: str = ""
    markers: tuple[str, ...] = ()
    reasoning: str = ""
    tools: Sequence[ToolSpec] = field(default_factory=lambda: TOOLS)


def run_stream(fixture: Fixture, pieces: Sequence[str], **options: object) -> tuple[list[ParsedChunk], list[str]]:
    parser = ToolStreamParser(fixture.tool_format, fixture.tools, new_call_id=counting_ids(), **options)  # pyright: ignore[reportArgumentType]
    chunks: list[ParsedChunk] = []
    for piece in pieces:
        chunks.extend(parser.feed(piece))
    chunks.extend(parser.finish())
    return chunks, parser.failures


def run_complete(fixture: Fixture, **options: object) -> list[ParsedChunk]:
    """The whole text fed at once, chunks merged: what a non-streaming response holds."""
    chunks, _ = run_stream(fixture, [fixture.text], **options)
    return merge_chunks(chunks)


def split_at(text: str, cuts: Sequence[int]) -> list[str]:
    bounds = [0, *sorted(set(cuts)), len(text)]
    return [text[start:end] for start, end in itertools.pairwise(bounds)]


def content_of(chunks: Sequence[ParsedChunk]) -> str:
    return "".join(chunk.text for chunk in chunks if isinstance(chunk, TokenChunk))


def reasoning_of(chunks: Sequence[ParsedChunk]) -> str:
    return "".join(chunk.text for chunk in chunks if isinstance(chunk, ReasoningChunk))


def calls_of(chunks: Sequence[ParsedChunk]) -> list[tuple[str, str]]:
    """(name, concatenated arguments) per call, in index order."""
    names: dict[int, str] = {}
    arguments: dict[int, list[str]] = {}
    for chunk in chunks:
        if isinstance(chunk, ToolCallChunk):
            names[chunk.index] = chunk.name
            arguments[chunk.index] = []
        elif isinstance(chunk, ToolCallArgumentsChunk):
            arguments[chunk.index].append(chunk.fragment)
    return [(names[index], "".join(arguments[index])) for index in sorted(names)]


def parses(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def check_stream_invariants(chunks: Sequence[ParsedChunk], markers: Sequence[str]) -> None:
    """The emission contract every stream must keep, whatever the split."""
    seen_ids: set[str] = set()
    next_index = 0
    accumulated: dict[int, str] = {}
    for chunk in chunks:
        if isinstance(chunk, ToolCallChunk):
            assert chunk.index == next_index, "calls get indices 0, 1, 2… in order"
            assert chunk.call_id not in seen_ids, "ids are unique"
            seen_ids.add(chunk.call_id)
            accumulated[chunk.index] = ""
            next_index += 1
        elif isinstance(chunk, ToolCallArgumentsChunk):
            assert chunk.index in accumulated, "arguments follow their call's first chunk"
            assert chunk.fragment, "no empty fragments"
            assert not parses(accumulated[chunk.index]) or not accumulated[chunk.index], (
                "a fragment arrived after the arguments already parsed as JSON"
            )
            accumulated[chunk.index] += chunk.fragment
    content = content_of(chunks)
    for marker in markers:
        assert marker not in content, f"marker {marker!r} leaked into content"


def assert_stream_matches(fixture: Fixture, pieces: Sequence[str], **options: object) -> list[ParsedChunk]:
    """Streaming over `pieces` merges to exactly the non-streaming result, and keeps the contract."""
    streamed, _ = run_stream(fixture, pieces, **options)
    check_stream_invariants(streamed, fixture.markers)
    complete = run_complete(fixture, **options)
    assert merge_chunks(streamed) == complete
    assert "".join(pieces) == fixture.text
    return streamed
