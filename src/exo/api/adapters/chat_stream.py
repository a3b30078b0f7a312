"""Chunks → OpenAI `chat.completion.chunk` SSE events, following the streaming contract of docs/TOOL_CALLING.md.

Role once in the first chunk; per tool call a first delta with index, id, type, name and empty arguments, then
argument fragments with only index and function.arguments; `finish_reason` on the last choice chunk; then the
usage chunk (`choices: []`) when asked; then `[DONE]`. An error mid-stream is one `error` event, then `[DONE]`.
"""

import json
from collections.abc import AsyncIterator
from typing import Any

from exo.api.adapters.chat_response import ChatAnswer
from exo.api.adapters.protocol_events import SSE_MEDIA_TYPE, sse_comment, write_events
from exo.api.errors import task_error
from exo.api.types.openai_chat import ChatCompletionResponse
from exo.shared.types.chunks import (
    Chunk,
    ErrorChunk,
    FinishChunk,
    PrefillProgressChunk,
    ReasoningChunk,
    TokenChunk,
    ToolCallArgumentsChunk,
    ToolCallChunk,
    Usage,
)

DONE_EVENT = "data: [DONE]\n\n"


def usage_payload(usage: Usage) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }
    # exo's own, only when the agent-loop guard withdrew a call (docs/TOOL_CALLING.md).
    if usage.withdrawn_tool_calls:
        payload["withdrawn_tool_calls"] = usage.withdrawn_tool_calls
    return payload


def error_payload(chunk: ErrorChunk) -> dict[str, Any]:
    return task_error(chunk).body.model_dump()


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


class ChunkEncoder:
    """Encodes one response's chunks; holds the values every chunk repeats (id, created, model)."""

    def __init__(self, completion_id: str, created: int, model: str, include_usage: bool) -> None:
        self.completion_id = completion_id
        self.created = created
        self.model = model
        self._base: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
        }
        self._include_usage = include_usage

    def _choice(self, delta: dict[str, Any], finish_reason: str | None = None, warnings: tuple[str, ...] = ()) -> str:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        # exo's own field on the finishing chunk: what the agent-loop guard found (see docs/TOOL_CALLING.md).
        extra = {"exo_loop_warnings": list(warnings)} if warnings else {}
        return _event({**self._base, "choices": [choice], **extra})

    def opening(self) -> str:
        return self._choice({"role": "assistant", "content": ""})

    def encode(self, chunk: Chunk) -> list[str]:
        match chunk:
            case TokenChunk(text=text):
                return [self._choice({"content": text})] if text else []
            case ReasoningChunk(text=text):
                return [self._choice({"reasoning_content": text})] if text else []
            case ToolCallChunk(index=index, call_id=call_id, name=name):
                call = {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
                return [self._choice({"tool_calls": [call]})]
            case ToolCallArgumentsChunk(index=index, fragment=fragment):
                if not fragment:
                    return []
                return [self._choice({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})]
            case FinishChunk(finish_reason=reason, usage=usage, loop_warnings=warnings):
                events = [self._choice({}, reason, warnings)]
                if self._include_usage:
                    events.append(_event({**self._base, "choices": [], "usage": usage_payload(usage)}))
                return events
            case ErrorChunk():
                return [_event(error_payload(chunk))]
            case PrefillProgressChunk():
                return []  # not content: the keep-alive comments carry it (completion_flow.py)


class ChatEventWriter:
    """Chat completions as an AnswerWriter: the role chunk first, `[DONE]` last (also after an error); the
    `chat.completion` the same chunks add up to is the non-streaming answer."""

    media_type = SSE_MEDIA_TYPE

    def __init__(self, encoder: ChunkEncoder) -> None:
        self._encoder = encoder
        self._answer = ChatAnswer(completion_id=encoder.completion_id, created=encoder.created, model=encoder.model)

    def opening(self) -> list[str]:
        return [self._encoder.opening()]

    def encode(self, chunk: Chunk) -> list[str]:
        self._answer.add(chunk)
        return self._encoder.encode(chunk)

    def closing(self) -> list[str]:
        return [DONE_EVENT]

    def keep_alive(self, where: str) -> list[str]:
        return sse_comment(where)

    def whole(self) -> ChatCompletionResponse:
        return self._answer.response()


def sse_events(encoder: ChunkEncoder, first: Chunk, rest: AsyncIterator[Chunk]) -> AsyncIterator[str]:
    """The whole SSE body: opening role chunk, every chunk, then `[DONE]` (also after an error)."""
    return write_events(ChatEventWriter(encoder), first, rest)
