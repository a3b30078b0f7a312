"""Merge a chunk stream into its shortest equivalent, to compare a streamed run with a whole-text run."""

from collections.abc import Iterable

from exo.shared.types.chunks import ParsedChunk, ReasoningChunk, TokenChunk, ToolCallArgumentsChunk


def _key(chunk: ParsedChunk) -> tuple[str, int] | None:
    match chunk:
        case TokenChunk() | ReasoningChunk():
            return (chunk.kind, -1)
        case ToolCallArgumentsChunk():
            return (chunk.kind, chunk.index)
        case _:
            return None


def _joined(first: ParsedChunk, texts: list[str]) -> ParsedChunk:
    match first:
        case TokenChunk():
            return TokenChunk(text="".join(texts))
        case ReasoningChunk():
            return ReasoningChunk(text="".join(texts))
        case ToolCallArgumentsChunk():
            return ToolCallArgumentsChunk(index=first.index, fragment="".join(texts))
        case _:
            return first


def _text(chunk: ParsedChunk) -> str:
    match chunk:
        case TokenChunk() | ReasoningChunk():
            return chunk.text
        case ToolCallArgumentsChunk():
            return chunk.fragment
        case _:
            return ""


def merge_chunks(chunks: Iterable[ParsedChunk]) -> list[ParsedChunk]:
    """Join neighbouring content, reasoning, and argument fragments of the same call (linear time)."""
    merged: list[ParsedChunk] = []
    run: list[str] = []
    run_first: ParsedChunk | None = None
    for chunk in chunks:
        key = _key(chunk)
        if run_first is not None and key is not None and key == _key(run_first):
            run.append(_text(chunk))
            continue
        if run_first is not None:
            merged.append(_joined(run_first, run))
            run_first, run = None, []
        if key is None:
            merged.append(chunk)
        else:
            run_first, run = chunk, [_text(chunk)]
    if run_first is not None:
        merged.append(_joined(run_first, run))
    return merged
