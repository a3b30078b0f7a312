"""One entry point for checking a streamed response: the contract rules, then openai-python's reading of it."""

from collections.abc import Sequence

from exo.conformance.contract import StreamCheck, Violation, walk_stream
from exo.conformance.openai_crosscheck import openai_violations


def sse_payloads(body: str) -> list[str]:
    """The `data:` payloads of an SSE body, in order (one per event; multi-line data joined with newlines)."""
    payloads: list[str] = []
    for event in body.replace("\r\n", "\n").split("\n\n"):
        lines = [line.removeprefix("data:").removeprefix(" ") for line in event.split("\n") if line.startswith("data:")]
        if lines:
            payloads.append("\n".join(lines))
    return payloads


def check_stream(payloads: Sequence[str], *, include_usage: bool, named_tool_choice: bool = False) -> StreamCheck:
    """Every contract violation of one streamed response, plus any disagreement of openai-python's accumulator."""
    walked = walk_stream(payloads, include_usage=include_usage, named_tool_choice=named_tool_choice)
    extra = openai_violations(payloads, walked.summary)
    return StreamCheck(summary=walked.summary, violations=(*walked.violations, *extra))


def stream_violations(
    payloads: Sequence[str], *, include_usage: bool, named_tool_choice: bool = False
) -> list[Violation]:
    """The violations alone: empty when the stream is safe for openai-python and the AI SDK."""
    return list(check_stream(payloads, include_usage=include_usage, named_tool_choice=named_tool_choice).violations)
