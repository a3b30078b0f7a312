"""A second reader of a Messages API stream: every event must validate as the `anthropic` SDK's type for it, and
the SDK's own accumulator must end with the message the grammar checker read (the calls, ids, inputs and text).
"""

import json
from typing import Any, cast

from anthropic.lib.streaming._messages import accumulate_event  # pyright: ignore[reportPrivateUsage]
from anthropic.types import RawMessageStreamEvent, ToolUseBlock
from pydantic import TypeAdapter, ValidationError

from exo.conformance.contract import Violation
from exo.conformance.json_view import JsonMapping
from exo.conformance.protocol_check import ProtocolSummary

_EVENT_ADAPTER: TypeAdapter[RawMessageStreamEvent] = TypeAdapter(RawMessageStreamEvent)


def anthropic_violations(events: list[JsonMapping], summary: ProtocolSummary) -> list[Violation]:
    """Each event must validate as the `anthropic` SDK's type for it, and its accumulator must read the stream as
    the walker did."""
    problems: list[Violation] = []
    snapshot: Any = None
    json_buffers: dict[int, bytes] = {}
    try:
        for position, data in enumerate(events):
            if data.get("type") in ("error", "ping"):
                continue
            try:
                _EVENT_ADAPTER.validate_python(data)
            except ValidationError as error:
                message = f"event {position} ({data.get('type')}) is not the SDK's type: {error.errors()[0]}"
                problems.append(Violation(rule="messages:sdk-types", message=message[:300]))
            # The accumulator builds events from plain dicts itself, as it does while streaming.
            snapshot = accumulate_event(event=cast(Any, data), current_snapshot=snapshot, json_bufs=json_buffers)
    except Exception as error:  # the accumulator raises on streams it cannot read
        return [*problems, Violation(rule="messages:anthropic-sdk", message=f"{type(error).__name__}: {error}"[:300])]
    if snapshot is None:
        return [*problems, Violation(rule="messages:anthropic-sdk", message="no message to accumulate")]
    uses = [(block.id, block.name, block.input) for block in snapshot.content if isinstance(block, ToolUseBlock)]
    expected = [(call.call_id, call.name, json.loads(call.arguments or "{}")) for call in summary.calls]
    text = "".join(block.text for block in snapshot.content if block.type == "text")
    if uses != expected:
        problems.append(Violation(rule="messages:anthropic-sdk", message=f"the SDK accumulated calls {uses}"[:300]))
    if text != summary.content:
        problems.append(Violation(rule="messages:anthropic-sdk", message=f"the SDK accumulated text {text!r}"[:300]))
    return problems
