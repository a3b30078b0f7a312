"""Hand-written SSE payloads, independent of our encoder, so the checker is tested against known shapes."""

import json
from collections.abc import Mapping

from exo.conformance.contract import DONE_PAYLOAD

CALL_ID_0 = "call_" + "a" * 24
CALL_ID_1 = "call_" + "b" * 24
_BASE: Mapping[str, object] = {
    "id": "chatcmpl-1",
    "object": "chat.completion.chunk",
    "created": 1700000000,
    "model": "m",
}
USAGE: Mapping[str, object] = {
    "prompt_tokens": 10,
    "completion_tokens": 5,
    "total_tokens": 15,
    "prompt_tokens_details": {"cached_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 0},
}


def chunk(delta: Mapping[str, object], finish_reason: str | None = None, **overrides: object) -> str:
    """One choice chunk's payload."""
    choice = {"index": 0, "delta": dict(delta), "logprobs": None, "finish_reason": finish_reason}
    return json.dumps({**_BASE, "choices": [choice], **overrides})


def role() -> str:
    return chunk({"role": "assistant", "content": ""})


def content(text: str) -> str:
    return chunk({"content": text})


def reasoning(text: str) -> str:
    return chunk({"reasoning_content": text})


def call_start(index: int, call_id: str, name: str = "get_weather") -> str:
    call = {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
    return chunk({"tool_calls": [call]})


def call_arguments(index: int, fragment: str) -> str:
    return chunk({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})


def finish(reason: str) -> str:
    return chunk({}, reason)


def usage(usage_fields: Mapping[str, object] = USAGE) -> str:
    return json.dumps({**_BASE, "choices": [], "usage": dict(usage_fields)})


def error() -> str:
    return json.dumps({"error": {"message": "boom", "type": "server_error", "param": None, "code": None}})


def tool_call_stream() -> list[str]:
    """A correct stream: two parallel calls with split arguments, usage, [DONE]."""
    return [
        role(),
        content("Checking."),
        call_start(0, CALL_ID_0),
        call_arguments(0, '{"city": '),
        call_arguments(0, '"Paris"}'),
        call_start(1, CALL_ID_1),
        call_arguments(1, '{"city": "Rome", "days": 3}'),
        finish("tool_calls"),
        usage(),
        DONE_PAYLOAD,
    ]
