"""A second reader of the same stream: openai-python's own accumulator must end with what the contract reader did.

openai-python concatenates every string it sees per key (a repeated role becomes "assistantassistant", a
repeated id "call_1call_1") and indexes tool calls by `index`, so a stream that only looks right to our checker
still fails here if a client library would assemble it differently.
"""

import json
from collections.abc import Sequence

from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from exo.conformance.contract import DONE_PAYLOAD, StreamSummary, Violation
from exo.conformance.json_view import as_object

_RULE = "openai-python"


def _chunks(payloads: Sequence[str]) -> list[ChatCompletionChunk]:
    """The payloads openai-python would parse as chunks (it stops at [DONE] and raises on error events)."""
    chunks: list[ChatCompletionChunk] = []
    for payload in payloads:
        if payload == DONE_PAYLOAD:
            break
        try:
            decoded = as_object(json.loads(payload))
        except json.JSONDecodeError:
            continue  # the contract checker reports it
        if decoded is None or "error" in decoded:
            continue
        chunks.append(ChatCompletionChunk.model_validate(decoded))
    return chunks


def openai_violations(payloads: Sequence[str], summary: StreamSummary) -> list[Violation]:
    """Accumulate `payloads` with `ChatCompletionStreamState`; report where it disagrees with `summary`."""
    state = ChatCompletionStreamState()
    try:
        chunks = _chunks(payloads)
        for chunk in chunks:
            state.handle_chunk(chunk)
        if not chunks:
            return [Violation(rule=_RULE, message="no chunk to accumulate")]
        # The snapshot, not get_final_completion(): that one raises on finish_reason "length" by design.
        completion = state.current_completion_snapshot
    except Exception as error:  # the accumulator raises IndexError, ValidationError, … on streams it cannot read
        return [Violation(rule=_RULE, message=f"openai-python failed: {type(error).__name__}: {error}"[:300])]
    if not completion.choices:
        return [Violation(rule=_RULE, message="openai-python accumulated no choice")]
    message = completion.choices[0].message
    calls = [(call.id, call.function.name, call.function.arguments) for call in message.tool_calls or []]
    expected = [(call.call_id, call.name, call.arguments) for call in summary.calls]
    violations: list[Violation] = []
    if message.role != summary.role:
        violations.append(Violation(rule=_RULE, message=f"openai-python role is {message.role!r}"))
    if (message.content or "") != summary.content:
        violations.append(Violation(rule=_RULE, message=f"openai-python content is {message.content!r}"))
    if calls != expected:
        violations.append(Violation(rule=_RULE, message=f"openai-python accumulated different calls: {calls}"[:300]))
    return violations
