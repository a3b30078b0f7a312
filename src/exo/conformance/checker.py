"""One entry point for checking a streamed chat-completions response: the contract's numbered rules
(docs/TOOL_CALLING.md, "The streaming contract"), then openai-python's own reading of the stream where the SDK
is installed (a development dependency: a runtime-only install checks the rules alone).

The Messages and Responses streams have checkers of their own (messages_contract.py, responses_contract.py), with
their SDKs as optional second readers in the same way.
"""

from collections.abc import Callable, Sequence

from exo.conformance.contract import StreamCheck, StreamSummary, Violation, walk_stream
from exo.conformance.optional_sdk import optional_reader

SecondReader = Callable[[Sequence[str], StreamSummary], list[Violation]]


def sse_payloads(body: str) -> list[str]:
    """The `data:` payloads of an SSE body, in order (one per event; multi-line data joined with newlines)."""
    payloads: list[str] = []
    for event in body.replace("\r\n", "\n").split("\n\n"):
        lines = [line.removeprefix("data:").removeprefix(" ") for line in event.split("\n") if line.startswith("data:")]
        if lines:
            payloads.append("\n".join(lines))
    return payloads


def openai_reader() -> SecondReader | None:
    """openai-python's accumulator as a second reader, or None where the SDK is not installed."""

    def load() -> SecondReader:
        from exo.conformance.openai_crosscheck import openai_violations

        return openai_violations

    return optional_reader("openai", load)


def check_stream(payloads: Sequence[str], *, include_usage: bool) -> StreamCheck:
    """Every contract violation of one streamed response, plus any disagreement of openai-python's accumulator."""
    walked = walk_stream(payloads, include_usage=include_usage)
    reader = openai_reader()
    extra = reader(payloads, walked.summary) if reader is not None else []
    return StreamCheck(summary=walked.summary, violations=(*walked.violations, *extra))
