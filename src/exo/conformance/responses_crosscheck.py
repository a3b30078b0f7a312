"""A second reader of a Responses API stream: every event must validate as the `openai` SDK's type for it, and the
SDK's own stream state must end with the response the grammar checker read (the calls, ids, arguments and text).
"""

from typing import Any, cast

from openai import omit
from openai._models import construct_type  # pyright: ignore[reportPrivateUsage] - how the SDK builds stream events
from openai.lib.streaming.responses import ResponseStreamState
from openai.types.responses import ResponseFunctionToolCall, ResponseStreamEvent
from openai.types.responses.response_output_message import ResponseOutputMessage
from pydantic import TypeAdapter, ValidationError

from exo.conformance.contract import Violation
from exo.conformance.json_view import JsonMapping
from exo.conformance.protocol_check import ProtocolSummary

_EVENT_ADAPTER: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)


def responses_violations(events: list[JsonMapping], summary: ProtocolSummary) -> list[Violation]:
    """Each event must validate as the `openai` SDK's type for it, and its stream state must accumulate the same
    response the walker read (built from the events as the SDK builds them while streaming)."""
    problems: list[Violation] = []
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=omit, text_format=omit)
    final: Any = None
    try:
        for position, data in enumerate(events):
            try:
                _EVENT_ADAPTER.validate_python(data)
            except ValidationError as error:
                message = f"event {position} ({data.get('type')}) is not the SDK's type: {error.errors()[0]}"
                problems.append(Violation(rule="responses:sdk-types", message=message[:300]))
            event_object = cast(ResponseStreamEvent, construct_type(type_=ResponseStreamEvent, value=data))
            for event in state.handle_event(event_object):
                if event.type == "response.completed":
                    final = event.response
    except Exception as error:  # the accumulator raises on streams it cannot read
        return [*problems, Violation(rule="responses:openai-sdk", message=f"{type(error).__name__}: {error}"[:300])]
    if final is None:
        return [*problems, Violation(rule="responses:openai-sdk", message="the SDK saw no completed response")]
    calls = [
        (item.call_id, item.name, item.arguments) for item in final.output if isinstance(item, ResponseFunctionToolCall)
    ]
    expected = [(call.call_id, call.name, call.arguments) for call in summary.calls]
    messages = [item for item in final.output if isinstance(item, ResponseOutputMessage)]
    text = "".join(part.text for item in messages for part in item.content if part.type == "output_text")
    if calls != expected:
        problems.append(Violation(rule="responses:openai-sdk", message=f"the SDK accumulated calls {calls}"[:300]))
    if text != summary.content:
        problems.append(Violation(rule="responses:openai-sdk", message=f"the SDK accumulated text {text!r}"[:300]))
    return problems
