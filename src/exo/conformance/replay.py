"""Replay one sample output through the real pipeline: ToolStreamParser → chunks → SSE encoder → checker.

The parser is fed segment by segment as the runner feeds decoded tokens, the finish reason is decided as the
runner decides it, and the SSE body comes from the same `sse_events` the API streams. The non-streaming
collector reads the same chunks, so the two answers can be compared byte for byte.
"""

import json
import time
from collections.abc import AsyncIterator, Sequence

import anyio
from pydantic import computed_field

from exo.api.adapters import chat_response, chat_stream
from exo.api.types.openai_chat import ChatCompletionResponse
from exo.conformance.checker import check_stream, sse_payloads
from exo.conformance.contract import StreamSummary
from exo.conformance.protocol_replay import protocol_checks
from exo.conformance.samples import WEATHER_TOOL, ConformanceCase
from exo.shared.types.chunks import Chunk, FinishChunk, Usage
from exo.shared.types.common import FrozenModel
from exo.tool_calls import ToolFormatName, ToolStreamParser

_COMPLETION_ID = "chatcmpl-conformance"
_MODEL = "conformance"


class CaseResult(FrozenModel):
    """The verdict on one case: `problems` is empty when it passed."""

    tool_format: ToolFormatName
    case: str
    problems: tuple[str, ...]

    @computed_field
    @property
    def passed(self) -> bool:
        return not self.problems


def parse_segments(case: ConformanceCase) -> tuple[list[Chunk], list[str]]:
    """The chunks the runner would send for `case` (FinishChunk last), and the parser's failure notes."""
    parser = ToolStreamParser(case.tool_format, [WEATHER_TOOL])
    chunks: list[Chunk] = []
    for segment in case.segments:
        chunks.extend(parser.feed(segment))
    chunks.extend(parser.finish())
    usage = Usage(prompt_tokens=100, completion_tokens=len(case.segments))
    chunks.append(FinishChunk(finish_reason="tool_calls" if parser.tool_calls_emitted else "stop", usage=usage))
    return chunks, parser.failures


async def _iterate(chunks: Sequence[Chunk]) -> AsyncIterator[Chunk]:
    for chunk in chunks:
        yield chunk


async def _stream_body(chunks: Sequence[Chunk], include_usage: bool) -> str:
    encoder = chat_stream.ChunkEncoder(_COMPLETION_ID, int(time.time()), _MODEL, include_usage)
    rest = _iterate(chunks[1:])
    return "".join([event async for event in chat_stream.sse_events(encoder, chunks[0], rest)])


def encode_stream(chunks: Sequence[Chunk], *, include_usage: bool) -> list[str]:
    """The SSE `data:` payloads the API would stream for `chunks`."""
    return sse_payloads(anyio.run(_stream_body, chunks, include_usage))


def _collected_calls(chunks: Sequence[Chunk]) -> list[tuple[str, str, str]]:
    async def collect() -> ChatCompletionResponse:
        return await chat_response.collect_response(
            _iterate(chunks), completion_id=_COMPLETION_ID, created=0, model=_MODEL
        )

    message = anyio.run(collect).choices[0].message
    return [(call.id, call.function.name, call.function.arguments) for call in message.tool_calls or []]


def _expectation_problems(case: ConformanceCase, summary: StreamSummary) -> list[str]:
    problems: list[str] = []
    if summary.content != case.content:
        problems.append(f"content {summary.content!r}, expected {case.content!r}")
    if summary.reasoning != case.reasoning:
        problems.append(f"reasoning {summary.reasoning!r}, expected {case.reasoning!r}")
    received: list[tuple[str, object]] = []
    for call in summary.calls:
        try:
            received.append((call.name, json.loads(call.arguments)))
        except json.JSONDecodeError:
            received.append((call.name, call.arguments))
    expected = [(call.name, dict(call.arguments)) for call in case.calls]
    if received != expected:
        problems.append(f"calls {received}, expected {expected}")
    return problems


def replay_case(case: ConformanceCase) -> CaseResult:
    """Run `case` end to end and list every problem: contract violations, wrong calls or content, parser notes."""
    chunks, failures = parse_segments(case)
    checked = check_stream(encode_stream(chunks, include_usage=True), include_usage=True)
    problems = [f"[{violation.rule}] {violation.message}" for violation in checked.violations]
    problems.extend(_expectation_problems(case, checked.summary))
    if case.malformed and not failures:
        problems.append("parser: a malformed call was not noted as a failure")
    elif not case.malformed:
        problems.extend(f"parser: {failure}" for failure in failures)
    for protocol, protocol_check in protocol_checks(chunks):
        problems.extend(f"[{violation.rule}] {violation.message}" for violation in protocol_check.violations)
        summary = protocol_check.summary.as_stream_summary()
        problems.extend(f"{protocol}: {problem}" for problem in _expectation_problems(case, summary))
    streamed = [(call.call_id, call.name, call.arguments) for call in checked.summary.calls]
    if _collected_calls(chunks) != streamed:
        problems.append("the non-streaming response differs from the stream")
    return CaseResult(tool_format=case.tool_format, case=case.case, problems=tuple(problems))
