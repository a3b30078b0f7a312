"""Stream one OpenAI chat completion over HTTP and time it: time to first token, tokens, cached prompt tokens."""

import asyncio
import json
import time
from collections.abc import Sequence

import httpx
from pydantic import BaseModel, ConfigDict

from bench.results import StreamMeasurement
from exo.api.types.openai_chat import ChatMessage, ToolDefinition

REQUEST_TIMEOUT_S = 900.0


class _Lenient(BaseModel):
    # Servers add fields of their own (mlx_lm.server repeats `role`, adds `logprobs`…): read only what we need.
    model_config = ConfigDict(extra="ignore")


class _FunctionDelta(_Lenient):
    name: str | None = None
    arguments: str | None = None


class _ToolCallDelta(_Lenient):
    index: int = 0
    function: _FunctionDelta | None = None


class _Delta(_Lenient):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[_ToolCallDelta] | None = None


class _ChunkChoice(_Lenient):
    delta: _Delta


class _PromptDetails(_Lenient):
    cached_tokens: int = 0


class _Usage(_Lenient):
    prompt_tokens: int
    completion_tokens: int
    prompt_tokens_details: _PromptDetails | None = None


class _Chunk(_Lenient):
    choices: list[_ChunkChoice] = []
    usage: _Usage | None = None


class StreamOutcome(BaseModel):
    """A timed completion plus what an agent needs to continue the conversation."""

    measurement: StreamMeasurement
    tool_call: tuple[str, str] | None
    """(name, arguments) of the first tool call, when the reply was one."""


def request_body(
    messages: Sequence[ChatMessage], tools: Sequence[ToolDefinition], max_tokens: int
) -> dict[str, object]:
    """A greedy (temperature 0) streaming request that asks for usage in the last chunk."""
    body: dict[str, object] = {
        "messages": [message.model_dump(exclude_none=True) for message in messages],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": max_tokens,
        "temperature": 0.0,
    }
    if tools:
        body["tools"] = [tool.model_dump(exclude_none=True) for tool in tools]
    return body


class _Accumulator:
    """Folds SSE chunks into text, the first tool call, the time the first generated piece arrived, and usage."""

    def __init__(self, started: float, first_token: asyncio.Event | None) -> None:
        self.started = started
        self.first_token = first_token
        self.first_at: float | None = None
        self.pieces = 0
        self.text: list[str] = []
        self.tool_name: str | None = None
        self.tool_arguments: list[str] = []
        self.usage: _Usage | None = None

    def add(self, chunk: _Chunk) -> None:
        if chunk.usage is not None:
            self.usage = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            generated = [delta.content, delta.reasoning_content, delta.reasoning]
            produced = any(generated) or bool(delta.tool_calls)
            if produced and self.first_at is None:
                self.first_at = time.perf_counter()
                if self.first_token is not None:
                    self.first_token.set()
            self.pieces += int(produced)
            self.text.append(delta.content or "")
            for call in delta.tool_calls or []:
                if call.index != 0 or call.function is None:
                    continue
                self.tool_name = self.tool_name or call.function.name
                self.tool_arguments.append(call.function.arguments or "")

    def outcome(self) -> StreamOutcome:
        finished = time.perf_counter()
        first = self.first_at if self.first_at is not None else finished
        # Without usage, every generated SSE chunk counts as one token (both servers stream about one per token).
        completion = self.usage.completion_tokens if self.usage else self.pieces
        prompt = self.usage.prompt_tokens if self.usage else 0
        details = self.usage.prompt_tokens_details if self.usage else None
        measurement = StreamMeasurement(
            ttft_s=first - self.started,
            total_s=finished - self.started,
            completion_tokens=completion,
            prompt_tokens=prompt,
            cached_tokens=details.cached_tokens if details else 0,
            text="".join(self.text),
        )
        call = (self.tool_name, "".join(self.tool_arguments)) if self.tool_name else None
        return StreamOutcome(measurement=measurement, tool_call=call)


async def stream_chat(
    client: httpx.AsyncClient, base_url: str, body: dict[str, object], first_token: asyncio.Event | None = None
) -> StreamOutcome:
    """POST `body` to `base_url`/v1/chat/completions and read the SSE stream to the end; raises on HTTP errors.

    `first_token` is set as soon as the first generated piece arrives.
    """
    started = time.perf_counter()
    accumulator = _Accumulator(started, first_token)
    url = f"{base_url}/v1/chat/completions"
    async with client.stream("POST", url, json=body, timeout=REQUEST_TIMEOUT_S) as response:
        if response.status_code != 200:
            detail = (await response.aread()).decode(errors="replace")
            raise RuntimeError(f"{url} answered {response.status_code}: {detail[:500]}")
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line.removeprefix("data:").strip()
            if data == "[DONE]":
                break
            payload: object = json.loads(data)
            if isinstance(payload, dict) and "error" in payload:
                raise RuntimeError(f"{url} streamed an error: {data[:500]}")
            accumulator.add(_Chunk.model_validate(payload))
    return accumulator.outcome()
