"""The requests of `bench.soak`'s mixed load, each with what its client needs from the reply.

Every kind sends one request the way a client of its dialect would and judges the reply by the wire contract only
(status, the stream's terminal event, error shape, a tool call where one is required and its arguments as JSON),
never by the words a model writes, so the load runs on any model, fixture models included. A reply that breaks the
contract is an anomaly, kept with its detail; a client that gave up waiting (its own timeout) is counted apart.
"""

import json
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal, cast

import httpx
from pydantic import BaseModel

SoakKind = Literal[
    "chat_stream",
    "chat_required",
    "messages_stream",
    "responses_stream",
    "ollama_chat",
    "disconnect",
    "client_timeout",
    "long_prompt",
    "bad_input",
    "agent_session",
]

PROMPTS = (
    "What is the weather in Paris?",
    "Read the file src/main.py and tell me what it does.",
    "Write a haiku about the sea.",
    "Explain recursion in two sentences.",
    "List three prime numbers.",
)
_WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
_READ_FILE = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
_FUNCTIONS = (
    {"name": "get_weather", "description": "Get the weather for a city", "parameters": _WEATHER},
    {"name": "read_file", "description": "Read a file", "parameters": _READ_FILE},
)
CHAT_TOOLS = [{"type": "function", "function": function} for function in _FUNCTIONS]
MESSAGES_TOOLS = [
    {"name": function["name"], "description": function["description"], "input_schema": function["parameters"]}
    for function in _FUNCTIONS
]
RESPONSES_TOOLS = [{"type": "function", **function} for function in _FUNCTIONS]


class Target(BaseModel):
    """The model under load, and how long its long prompts may be."""

    model: str
    context_length: int

    @property
    def long_prompt_lines(self) -> tuple[int, int]:
        """The range of `long_text` lines a long prompt takes: up to a few thousand tokens, within half the context
        (a line is 12 to 24 tokens, by tokenizer)."""
        most = max(4, min(300, self.context_length // 2 // 24))
        return max(2, most // 3), most


class Outcome(BaseModel):
    kind: SoakKind
    seconds: float
    anomaly: str | None = None
    """What broke the wire contract (None: the reply was what its client needs)."""
    client_timeout: bool = False
    """The client gave up waiting (the kinds that do not mean to): slow, not wrong."""
    later_turns: int = 0
    """An agent session's turns after its first."""
    later_prompt_tokens: int = 0
    later_cached_tokens: int = 0
    """Those turns' prompt tokens, and how many of them the prefix cache gave (their usage's `cached_tokens`)."""


class _ContractBrokenError(Exception):
    """The reply broke the contract; the message says how."""


def long_text(rng: random.Random, lines: int) -> str:
    return " ".join(f"Line {index}: value {rng.randint(0, 10**6)} recorded." for index in range(lines))


async def _sse_lines(client: httpx.AsyncClient, path: str, body: dict[str, Any], stop_after: int | None = None) -> str:
    """The stream's data and event lines (all of them, or the first `stop_after` data lines, then hang up)."""
    kept: list[str] = []
    data_lines = 0
    async with client.stream("POST", path, json=body) as response:
        if response.status_code != 200:
            await response.aread()
        _require_ok(response)
        async for line in response.aiter_lines():
            if not line or line.startswith(":"):
                continue  # keep-alive comments
            kept.append(line)
            data_lines += line.startswith("data:") or line.startswith("{")
            if stop_after is not None and data_lines >= stop_after:
                break
    return "\n".join(kept)


def _require_ok(response: httpx.Response) -> None:
    """A reply other than 200 breaks the contract (its body must have been read)."""
    if response.status_code != 200:
        raise _ContractBrokenError(f"status {response.status_code}: {response.text[:300]}")


def _data(stream: str) -> list[dict[str, Any]]:
    return [json.loads(line[5:]) for line in stream.splitlines() if line.startswith("data: {")]


def _arguments_are_json(arguments: str, where: str) -> None:
    try:
        json.loads(arguments)
    except json.JSONDecodeError as error:
        raise _ContractBrokenError(
            f"{where}: tool call arguments are not JSON ({error}): {arguments[:200]!r}"
        ) from error


async def _chat_stream(client: httpx.AsyncClient, target: Target, rng: random.Random) -> None:
    tool_choice = rng.choice(["auto", "required", "none"])
    body = {
        "model": target.model,
        "messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
        "tools": CHAT_TOOLS,
        "tool_choice": tool_choice,
        "stream": True,
        "max_tokens": rng.choice([16, 48, 96]),
    }
    reply = await _read_chat_stream(client, body)
    _check_calls(reply.finish_reason, reply.arguments, tool_choice == "required")


class _ChatReply(BaseModel):
    """A streamed chat completion as its client puts it together."""

    text: str
    calls: list[dict[str, Any]]
    """As the assistant message sends them back: id, type and function (name, arguments)."""
    finish_reason: str | None
    usage: dict[str, Any] | None
    """The usage chunk, where `stream_options.include_usage` asked for it."""

    @property
    def arguments(self) -> list[str]:
        return [call["function"]["arguments"] for call in self.calls]


async def _read_chat_stream(client: httpx.AsyncClient, body: dict[str, Any]) -> _ChatReply:
    """The stream read whole; no `[DONE]` at its end or an error event in it breaks the contract."""
    stream = await _sse_lines(client, "/v1/chat/completions", body)
    if not stream.endswith("data: [DONE]"):
        raise _ContractBrokenError(f"no [DONE] at the end: {stream[-200:]!r}")
    text: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    for chunk in _data(stream):
        if "error" in chunk:
            raise _ContractBrokenError(f"error in the stream: {chunk['error']}")
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices", []):
            finish_reason = choice.get("finish_reason") or finish_reason
            delta = choice.get("delta") or {}
            text.append(delta.get("content") or "")
            for call in delta.get("tool_calls") or []:
                held = calls.setdefault(call["index"], {"id": "", "name": "", "arguments": ""})
                function = call.get("function") or {}
                held["id"] = call.get("id") or held["id"]
                held["name"] = function.get("name") or held["name"]
                held["arguments"] += function.get("arguments") or ""
    return _ChatReply(
        text="".join(text),
        calls=[
            {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}
            for call in calls.values()
        ],
        finish_reason=finish_reason,
        usage=usage,
    )


def _check_calls(finish_reason: str | None, arguments: list[str], required: bool) -> None:
    """The contract's finish reasons: `tool_calls` exactly when a call was sent, `length` when `max_tokens` cut the
    reply (a call's arguments then as far as they were written); every finished call's arguments are JSON."""
    if finish_reason == "length":
        return
    if required and not arguments:
        raise _ContractBrokenError(f"tool_choice required, no tool call (finish_reason {finish_reason})")
    if finish_reason != ("tool_calls" if arguments else "stop"):
        raise _ContractBrokenError(f"finish_reason {finish_reason} with {len(arguments)} tool call(s)")
    for index, text in enumerate(arguments):
        _arguments_are_json(text, f"call {index}")


async def _chat_required(client: httpx.AsyncClient, target: Target, rng: random.Random) -> None:
    body = {
        "model": target.model,
        "messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
        "tools": CHAT_TOOLS,
        "tool_choice": "required",
        "max_tokens": 80,
    }
    response = await client.post("/v1/chat/completions", json=body)
    _require_ok(response)
    choice = response.json()["choices"][0]
    calls: list[dict[str, Any]] = choice["message"].get("tool_calls") or []
    _check_calls(choice["finish_reason"], [call["function"]["arguments"] for call in calls], required=True)


async def _messages_stream(client: httpx.AsyncClient, target: Target, rng: random.Random) -> None:
    body = {
        "model": target.model,
        "max_tokens": rng.choice([16, 48, 96]),
        "messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
        "tools": MESSAGES_TOOLS,
        "stream": True,
    }
    stream = await _sse_lines(client, "/v1/messages", body)
    if "event: error" in stream:
        raise _ContractBrokenError(f"error event: {stream[-300:]!r}")
    if "event: message_stop" not in stream.splitlines()[-2:]:
        raise _ContractBrokenError(f"no message_stop at the end: {stream[-200:]!r}")


async def _responses_stream(client: httpx.AsyncClient, target: Target, rng: random.Random) -> None:
    body = {
        "model": target.model,
        "input": rng.choice(PROMPTS),
        "tools": RESPONSES_TOOLS,
        "stream": True,
        "max_output_tokens": rng.choice([16, 48, 96]),
    }
    stream = await _sse_lines(client, "/v1/responses", body)
    events = [line[7:] for line in stream.splitlines() if line.startswith("event: ")]
    # Cut short by max_output_tokens, a response ends `response.incomplete`, as OpenAI's does.
    if not events or events[-1] not in ("response.completed", "response.incomplete"):
        raise _ContractBrokenError(f"ends with {events[-1:] or 'nothing'}: {stream[-200:]!r}")


async def _ollama_chat(client: httpx.AsyncClient, target: Target, rng: random.Random) -> None:
    body = {
        "model": target.model,
        "messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
        "tools": CHAT_TOOLS,
        "stream": True,
        "options": {"num_predict": rng.choice([16, 48, 96])},
    }
    stream = await _sse_lines(client, "/api/chat", body)
    last = json.loads(stream.splitlines()[-1])
    if last.get("done") is not True or "error" in last:
        raise _ContractBrokenError(f"last line is not done: {stream[-200:]!r}")


async def _disconnect(client: httpx.AsyncClient, target: Target, rng: random.Random) -> None:
    """Hang up after the first data line, during the prefill when the prompt is long."""
    content = long_text(rng, rng.randint(*target.long_prompt_lines)) if rng.random() < 0.3 else rng.choice(PROMPTS)
    body = {
        "model": target.model,
        "messages": [{"role": "user", "content": content}],
        "stream": True,
        "max_tokens": 200,
    }
    await _sse_lines(client, "/v1/chat/completions", body, stop_after=1)


async def _client_timeout(client: httpx.AsyncClient, target: Target, rng: random.Random) -> None:
    """A non-streamed request whose client gives up after half a second, during its prefill."""
    body = {
        "model": target.model,
        "messages": [{"role": "user", "content": long_text(rng, target.long_prompt_lines[1])}],
        "max_tokens": 100,
    }
    try:
        await client.post("/v1/chat/completions", json=body, timeout=0.5)
    except httpx.TimeoutException:
        return


async def _long_prompt(client: httpx.AsyncClient, target: Target, rng: random.Random) -> None:
    content = long_text(rng, rng.randint(*target.long_prompt_lines)) + "\nSummarize in one sentence."
    body = {"model": target.model, "messages": [{"role": "user", "content": content}], "max_tokens": 24}
    response = await client.post("/v1/chat/completions", json=body)
    _require_ok(response)


_BAD_BODIES: tuple[tuple[str, bytes | dict[str, Any]], ...] = (
    ("/v1/chat/completions", b"{not json"),
    ("/v1/chat/completions", {"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}),
    ("/v1/chat/completions", {"model": "{model}", "messages": "not a list"}),
    ("/v1/chat/completions", {"model": "{model}", "messages": [{"role": "user", "content": "x"}], "max_tokens": -5}),
    (
        "/v1/chat/completions",
        {
            "model": "{model}",
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "bad name!", "parameters": {"type": "objekt"}}}],
        },
    ),
    ("/v1/messages", {"model": "{model}", "max_tokens": 10, "messages": []}),
)


async def _bad_input(client: httpx.AsyncClient, target: Target, rng: random.Random) -> None:
    """A body a client gets wrong: a 4xx with its dialect's error object, never a 5xx or a success."""
    path, body = rng.choice(_BAD_BODIES)
    if isinstance(body, bytes):
        response = await client.post(path, content=body, headers={"content-type": "application/json"})
    else:
        filled = {key: target.model if value == "{model}" else value for key, value in body.items()}
        response = await client.post(path, json=filled)
    if not 400 <= response.status_code < 500:
        raise _ContractBrokenError(f"{path} {str(body)[:80]}: status {response.status_code}: {response.text[:200]}")
    try:
        error: object = response.json().get("error")
    except json.JSONDecodeError:
        error = None
    message: object = cast(dict[str, object], error).get("message") if isinstance(error, dict) else None
    if not isinstance(message, str) or not message:
        raise _ContractBrokenError(f"{path} {str(body)[:80]}: no error object with a message: {response.text[:200]}")


AGENT_SYSTEM_PROMPT = " ".join(
    f"Rule {index}: read the files a change touches before editing them, keep the tests passing, and say what "
    "you changed."
    for index in range(1, 21)
)
"""The same for every session, as a coding agent's system prompt is: later sessions find it in the prefix cache."""
AGENT_TASKS = (
    "What is the weather in Paris?",
    "Read the file src/main.py and tell me what it does.",
    "Read the file README.md, then the weather in Oslo.",
)
_TOOL_NAMES = frozenset(function["name"] for function in _FUNCTIONS)


async def _agent_turn(client: httpx.AsyncClient, body: dict[str, Any]) -> _ChatReply:
    """One streamed turn, judged as `_chat_stream` judges its reply, and besides: each call's id (unique) and name (a
    tool offered), which a client sends back, and the usage it asked for."""
    reply = await _read_chat_stream(client, body)
    _check_calls(reply.finish_reason, reply.arguments, required=False)
    ids = [call["id"] for call in reply.calls]
    if any(not call_id for call_id in ids) or len(set(ids)) != len(ids):
        raise _ContractBrokenError(f"tool call ids missing or repeated: {ids}")
    if names := {call["function"]["name"] for call in reply.calls} - _TOOL_NAMES:
        raise _ContractBrokenError(f"tool calls to tools not offered: {sorted(names)}")
    if reply.usage is None:
        raise _ContractBrokenError("no usage chunk though stream_options.include_usage was set")
    return reply


async def _agent_session(client: httpx.AsyncClient, target: Target, rng: random.Random) -> Outcome:
    """A coding agent's session of two to four turns: the shared system prompt, the tools and a task, then each turn
    the whole history sent back with the assistant's reply and, after a call, its result (else the user's "go on"), as
    agents do; a turn cut by `max_tokens` ends the session (its client could not run a call half written)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": AGENT_SYSTEM_PROMPT},
        {"role": "user", "content": rng.choice(AGENT_TASKS)},
    ]
    outcome = Outcome(kind="agent_session", seconds=0.0)
    for turn in range(rng.randint(2, 4)):
        body = {
            "model": target.model,
            "messages": messages,
            "tools": CHAT_TOOLS,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": 64,
        }
        reply = await _agent_turn(client, body)
        if turn > 0 and reply.usage is not None:
            outcome.later_turns += 1
            outcome.later_prompt_tokens += reply.usage["prompt_tokens"]
            outcome.later_cached_tokens += (reply.usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        if reply.finish_reason == "length":
            break
        assistant: dict[str, Any] = {"role": "assistant", "content": reply.text}
        if reply.calls:
            assistant["tool_calls"] = reply.calls
        messages.append(assistant)
        if not reply.calls:
            messages.append({"role": "user", "content": "Go on."})
        for call in reply.calls:
            result = f"{call['function']['name']} returned {rng.randint(0, 10**6)}."
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return outcome


_SENDERS: dict[SoakKind, Callable[[httpx.AsyncClient, Target, random.Random], Awaitable[Outcome | None]]] = {
    "chat_stream": _chat_stream,
    "chat_required": _chat_required,
    "messages_stream": _messages_stream,
    "responses_stream": _responses_stream,
    "ollama_chat": _ollama_chat,
    "disconnect": _disconnect,
    "client_timeout": _client_timeout,
    "long_prompt": _long_prompt,
    "bad_input": _bad_input,
    "agent_session": _agent_session,
}
MIX: dict[SoakKind, int] = {
    "chat_stream": 4,
    "chat_required": 3,
    "messages_stream": 2,
    "responses_stream": 2,
    "ollama_chat": 2,
    "disconnect": 2,
    "client_timeout": 1,
    "long_prompt": 1,
    "bad_input": 2,
    "agent_session": 2,
}
"""How often each kind is drawn, relative to the others: mostly agent-shaped requests with tools."""


async def send(kind: SoakKind, client: httpx.AsyncClient, target: Target, rng: random.Random) -> Outcome:
    started = time.monotonic()
    try:
        outcome = await _SENDERS[kind](client, target, rng)
    except _ContractBrokenError as broken:
        return Outcome(kind=kind, seconds=time.monotonic() - started, anomaly=str(broken))
    except httpx.TimeoutException:
        return Outcome(kind=kind, seconds=time.monotonic() - started, client_timeout=True)
    except (httpx.HTTPError, json.JSONDecodeError, KeyError, IndexError) as error:
        return Outcome(kind=kind, seconds=time.monotonic() - started, anomaly=f"{type(error).__name__}: {error}")
    seconds = time.monotonic() - started
    return Outcome(kind=kind, seconds=seconds) if outcome is None else outcome.model_copy(update={"seconds": seconds})
