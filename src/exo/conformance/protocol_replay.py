"""The same runner chunks through the Messages and Responses encoders: each stream checked, each collected answer
compared with what its stream accumulates to.

A tool-call format that passes for Chat Completions must pass here too: the adapters add no parsing of their own,
so a failure here is an encoder bug, not a format bug.
"""

import json
from collections.abc import AsyncIterator, Sequence

import anyio

from exo.api.adapters.messages_response import collect_message
from exo.api.adapters.messages_stream import MessageStreamEncoder
from exo.api.adapters.protocol_events import sse_body
from exo.api.adapters.responses_response import collect_response
from exo.api.adapters.responses_stream import ResponseStreamEncoder
from exo.api.types.anthropic_messages import ToolUseContent
from exo.api.types.openai_responses_output import FunctionCallOutput, ResponseObject
from exo.conformance.contract import Violation
from exo.conformance.messages_contract import check_messages_stream
from exo.conformance.protocol_check import ProtocolCheck
from exo.conformance.responses_contract import check_responses_stream
from exo.shared.types.chunks import Chunk

_MODEL = "conformance"


async def _iterate(chunks: Sequence[Chunk]) -> AsyncIterator[Chunk]:
    for chunk in chunks:
        yield chunk


def _initial_response() -> ResponseObject:
    return ResponseObject(id="resp_conformance", created_at=0, status="in_progress", model=_MODEL, output=[])


Calls = list[tuple[str, str, object]]


async def _messages(chunks: Sequence[Chunk]) -> tuple[str, Calls]:
    encoder = MessageStreamEncoder("msg_conformance", _MODEL)
    body = "".join([event async for event in sse_body(encoder, chunks[0], _iterate(chunks[1:]))])
    message = await collect_message(_iterate(chunks), message_id="msg_conformance", model=_MODEL)
    calls: Calls = [
        (block.id, block.name, block.input) for block in message.content if isinstance(block, ToolUseContent)
    ]
    return body, calls


async def _responses(chunks: Sequence[Chunk]) -> tuple[str, Calls]:
    encoder = ResponseStreamEncoder(_initial_response())
    body = "".join([event async for event in sse_body(encoder, chunks[0], _iterate(chunks[1:]))])
    response = await collect_response(_iterate(chunks), _initial_response())
    calls: Calls = [
        (item.call_id, item.name, item.arguments) for item in response.output if isinstance(item, FunctionCallOutput)
    ]
    return body, calls


def protocol_checks(chunks: Sequence[Chunk]) -> list[tuple[str, ProtocolCheck]]:
    """Each extra protocol's check of the stream `chunks` make; a collected answer that differs is a violation."""
    messages_body, message_calls = anyio.run(_messages, chunks)
    responses_body, response_calls = anyio.run(_responses, chunks)
    results: list[tuple[str, ProtocolCheck]] = []
    for protocol, checked, collected in (
        ("messages", check_messages_stream(messages_body), message_calls),
        ("responses", check_responses_stream(responses_body), response_calls),
    ):
        streamed: Calls = [
            (call.call_id, call.name, json.loads(call.arguments) if protocol == "messages" else call.arguments)
            for call in checked.summary.calls
        ]
        violations = checked.violations
        if collected != streamed:
            mismatch = Violation(rule=f"{protocol}:collect", message="the non-streaming answer differs from the stream")
            violations = (*violations, mismatch)
        results.append((protocol, checked.model_copy(update={"violations": violations})))
    return results
