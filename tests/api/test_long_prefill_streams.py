"""Streams whose prompt takes longer to read than a client waits in silence, through a real node.

The fixture model's context is widened so that a long prompt (thousands of repeated sentences) makes the runner's
prefill last well over the keep-alive interval on this machine: the prompt length is sized from a timed first
request, nothing in the node is slowed for the test. The node decodes one request at a time (`--batch-size 1`),
so a request sent during a long prefill really waits in the queue.

What must hold: the status and headers come at admission (long before the first token), SSE comment lines keep the
connection busy at least every KEEP_ALIVE_SECONDS and the official SDKs parse the stream around them, a Messages
stream also gets a content event at least every KEEP_ALIVE_SECONDS (Claude Code's watchdog counts only those) that
the model's text continues or its tool call follows, /state shows the running task's phase and prompt progress, a
request refused after its headers went out gets its dialect's error event, and every request ends with one log line.
"""

import itertools
import json
import re
import threading
import time
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from anthropic.types import MessageParam, ToolParam
from openai.types.chat import ChatCompletionUserMessageParam

from exo.api.answer_stream import ADMISSION_WAIT_SECONDS, KEEP_ALIVE_SECONDS
from exo.conformance.messages_contract import check_messages_stream
from tests.exo_server import ExoServer, running_exo
from tests.fixtures.endless_model import MODEL, WIDE_MODEL, endless_copy, wide_copy

CONTEXT_LENGTH = 65536
SENTENCE = "The quick brown fox jumps over the lazy dog. "
# What the longest prefill of a test should take; comfortably above KEEP_ALIVE_SECONDS on any machine load.
TARGET_PREFILL_SECONDS = 3 * KEEP_ALIVE_SECONDS
CALIBRATION_SENTENCES = 800
# The most sentences a prompt may hold within CONTEXT_LENGTH, room left for the answer (a sentence is 11 tokens).
LONGEST_PROMPT_SENTENCES = (CONTEXT_LENGTH - 2048) // 11
# Enough answer for /state to be seen decoding: the fixture model decodes about 550 tokens a second at this length
# (200 tokens once ended between two polls of a loaded machine's /state); room for it is left by the prompt's bound.
DECODE_TOKENS = 1500
# Slack for a busy machine between the node writing a keep-alive and this process reading it.
READ_SLACK_SECONDS = 3.0


@dataclass
class Calibrated:
    server: ExoServer
    sentences: int
    """Sentences of a prompt whose prefill takes about TARGET_PREFILL_SECONDS here."""


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Calibrated]:
    with calibrated_node(tmp_path_factory.mktemp("long-prefill"), with_wide_model=True) as calibrated:
        yield calibrated


@contextmanager
def calibrated_node(directory: Path, *, with_wide_model: bool = False) -> Generator[Calibrated]:
    """A node serving the long-context fixture model one request at a time, with the prompt size it needs; with
    `with_wide_model`, also the same weights with their end of sequence kept (WIDE_MODEL), whose prefill takes as
    long."""
    models = [endless_copy(directory, context_length=CONTEXT_LENGTH)]
    if with_wide_model:
        models.append(wide_copy(directory, CONTEXT_LENGTH))
    # Two runners loading side by side on a loaded 2-core machine have taken over a minute.
    with running_exo(models, directory, ["--batch-size", "1"], ready_timeout=300) as server:
        client = server.openai_client()
        client.chat.completions.create(model=MODEL, messages=[user("calibration", CALIBRATION_SENTENCES)], max_tokens=1)
        seconds = logged_prefill_seconds(server)
        # At these lengths attention makes prefill time grow about as the square of the prompt (measured: 3,341
        # tokens in 0.56 s, 22,580 in 32.5 s on a busy 2-core machine).
        scale = (TARGET_PREFILL_SECONDS / max(seconds, 0.05)) ** 0.5
        sentences = max(int(CALIBRATION_SENTENCES * scale), CALIBRATION_SENTENCES)
        yield Calibrated(server, min(sentences, LONGEST_PROMPT_SENTENCES))


def logged_prefill_seconds(server: ExoServer) -> float:
    """The prefill time the node logged for the last request (the request's own measure: no HTTP, no queue)."""
    deadline = time.monotonic() + 10
    while not (times := re.findall(r"request \S+ .* prefill=([\d.]+)s ", server.log())):
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.2)
    return float(times[-1])


def prompt_text(tag: str, sentences: int) -> str:
    """`sentences` sentences; `tag` first, so no two prompts share a cached prefix."""
    return f"Request {tag}. " + SENTENCE * sentences


def user(tag: str, sentences: int) -> ChatCompletionUserMessageParam:
    return {"role": "user", "content": prompt_text(tag, sentences)}


def anthropic_user(tag: str, sentences: int) -> MessageParam:
    return {"role": "user", "content": prompt_text(tag, sentences)}


@dataclass
class Wire:
    """What reached the client: when the headers came, and every read of the body with its time."""

    started: float = field(default_factory=time.monotonic)
    headers_at: float | None = None
    reads: list[tuple[float, bytes]] = field(default_factory=list[tuple[float, bytes]])

    def body(self) -> str:
        return b"".join(part for _, part in self.reads).decode()

    def comments(self) -> list[str]:
        return [line for line in self.body().split("\n") if line.startswith(":")]

    def events(self) -> list[tuple[float, dict[str, Any]]]:
        """The data of every SSE event, with the time of the read that completed it (comment lines skipped)."""
        events: list[tuple[float, dict[str, Any]]] = []
        pending = b""
        for at, part in self.reads:
            *complete, pending = (pending + part).split(b"\n\n")
            for block in complete:
                data = [line[len(b"data: ") :] for line in block.split(b"\n") if line.startswith(b"data: ")]
                if data:
                    events.append((at, json.loads(b"\n".join(data))))
        return events

    def longest_silence(self, until: float) -> float:
        """The longest time without a byte from the headers until `until`."""
        assert self.headers_at is not None
        times = [self.headers_at, *(at for at, _ in self.reads if at <= until), until]
        return max(later - earlier for earlier, later in itertools.pairwise(times))


class _RecordedStream(httpx2.SyncByteStream):
    def __init__(self, stream: httpx2.SyncByteStream, wire: Wire) -> None:
        self._stream = stream
        self._wire = wire

    def __iter__(self) -> Iterator[bytes]:
        for part in self._stream:
            self._wire.reads.append((time.monotonic(), part))
            yield part

    def close(self) -> None:
        self._stream.close()


class RecordingTransport(httpx2.BaseTransport):
    """httpx's transport, noting when the response headers and each piece of the body arrive (for the SDKs)."""

    def __init__(self) -> None:
        self._inner = httpx2.HTTPTransport()
        self.wire = Wire()

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        self.wire = Wire()
        response = self._inner.handle_request(request)
        self.wire.headers_at = time.monotonic()
        assert isinstance(response.stream, httpx2.SyncByteStream)
        stream = _RecordedStream(response.stream, self.wire)
        return httpx2.Response(
            response.status_code, headers=response.headers, stream=stream, extensions=response.extensions
        )


def recorded_openai(server: ExoServer) -> tuple[openai.OpenAI, RecordingTransport]:
    transport = RecordingTransport()
    client = openai.OpenAI(
        base_url=f"{server.base_url}/v1",
        api_key="unused",
        max_retries=0,
        timeout=httpx2.Timeout(300, connect=10),
        http_client=httpx2.Client(transport=transport),
    )
    return client, transport


def recorded_anthropic(server: ExoServer) -> tuple[anthropic.Anthropic, RecordingTransport]:
    transport = RecordingTransport()
    client = anthropic.Anthropic(
        base_url=server.base_url,
        api_key="unused",
        max_retries=0,
        timeout=httpx2.Timeout(300, connect=10),
        http_client=httpx2.Client(transport=transport),
    )
    return client, transport


def assert_kept_alive(wire: Wire, first_output_at: float) -> None:
    """Headers at admission, then no silence longer than the keep-alive interval until the first output."""
    assert wire.headers_at is not None
    assert wire.headers_at - wire.started < ADMISSION_WAIT_SECONDS + READ_SLACK_SECONDS
    prefill = first_output_at - wire.headers_at
    assert prefill > KEEP_ALIVE_SECONDS + 1, f"the prompt took only {prefill:.1f} s: too short to test keep-alives"
    assert len(wire.comments()) >= int(prefill // KEEP_ALIVE_SECONDS) - 1, wire.comments()
    assert wire.longest_silence(first_output_at) < KEEP_ALIVE_SECONDS + READ_SLACK_SECONDS


def assert_events_kept_alive(wire: Wire, first_output_at: float) -> None:
    """From message_start to the model's first output, no silence between events other than `ping` longer than the
    keep-alive interval (what Claude Code's stream watchdog counts), and the first keep-alive opened text block 0."""
    events = [(at, event) for at, event in wire.events() if event["type"] != "ping" and at <= first_output_at]
    assert events[0][1]["type"] == "message_start"
    assert events[1][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": "", "citations": None},
    }
    times = [at for at, _ in events] + [first_output_at]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert max(gaps) < KEEP_ALIVE_SECONDS + READ_SLACK_SECONDS, gaps
    prefill = first_output_at - times[0]
    assert len(events) >= int(prefill // KEEP_ALIVE_SECONDS), [event for _, event in events]


def content_of(message: anthropic.types.Message) -> list[dict[str, Any]]:
    """The message's content blocks as the wire has them (the SDK's parsed blocks carry extra empty fields)."""
    return [block.model_dump(exclude_none=True, exclude={"parsed_output"}) for block in message.content]


def running_tasks(server: ExoServer) -> list[dict[str, Any]]:
    tasks = server.state()["tasks"]
    assert isinstance(tasks, dict)
    return list(tasks.values())  # pyright: ignore[reportUnknownArgumentType, reportUnknownVariableType]


class StateWatcher:
    """Polls /state in a thread while a request runs, keeping every task entry it sees."""

    def __init__(self, server: ExoServer) -> None:
        self._server = server
        self.seen: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> "StateWatcher":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(0.1):
            self.seen += running_tasks(self._server)


def test_an_openai_stream_gets_headers_at_once_keep_alives_through_a_long_prefill_and_state_shows_it(
    node: Calibrated,
) -> None:
    client, transport = recorded_openai(node.server)
    with StateWatcher(node.server) as watcher:
        stream = client.chat.completions.create(
            model=MODEL, messages=[user("openai", node.sentences)], max_tokens=DECODE_TOKENS, stream=True
        )
        first_output_at: float | None = None
        text: list[str] = []
        finish: str | None = None
        for chunk in stream:
            for choice in chunk.choices:
                if choice.delta.content:
                    first_output_at = first_output_at or time.monotonic()
                    text.append(choice.delta.content)
                finish = choice.finish_reason or finish
    assert first_output_at is not None
    assert text
    assert finish == "length"
    assert_kept_alive(transport.wire, first_output_at)
    assert any(comment.startswith(": prefill ") for comment in transport.wire.comments())
    phases = [task["phase"] for task in watcher.seen]
    assert "prefill" in phases
    assert "decode" in phases
    prefill = next(task for task in watcher.seen if task["phase"] == "prefill")
    assert prefill["prompt_tokens"] > node.sentences * 11
    assert 0 <= prefill["done_tokens"] <= prefill["prompt_tokens"]
    decoding = next(task for task in watcher.seen if task["phase"] == "decode")
    assert decoding["done_tokens"] == decoding["prompt_tokens"] == prefill["prompt_tokens"]
    assert_logged(node.server, "chat.completions", prompt=prefill["prompt_tokens"], finish="length")


def test_an_anthropic_stream_parses_keep_alives_and_requests_refused_after_admission_get_error_events(
    node: Calibrated,
) -> None:
    client, transport = recorded_anthropic(node.server)
    too_long = CONTEXT_LENGTH // 10  # sentences: more tokens than the model's context
    outcomes: dict[str, object] = {}

    def queued_chat() -> None:
        wire_client, wire = recorded_openai(node.server)
        stream = wire_client.chat.completions.create(
            model=MODEL, messages=[user("chat too long", too_long)], max_tokens=5, stream=True
        )
        outcomes["chat headers"] = wire.wire.headers_at
        try:
            for _ in stream:
                pass
        except openai.APIError as error:
            outcomes["chat"] = error
            outcomes["chat error at"] = time.monotonic()

    def queued_responses() -> None:
        wire_client, wire = recorded_openai(node.server)
        stream = wire_client.responses.create(
            model=MODEL, input=prompt_text("responses too long", too_long), max_output_tokens=5, stream=True
        )
        outcomes["responses headers"] = wire.wire.headers_at
        outcomes["responses"] = [event.type for event in stream]
        outcomes["responses error at"] = time.monotonic()

    with client.messages.stream(
        model=MODEL,
        max_tokens=50,
        messages=[anthropic_user("anthropic", node.sentences)],
    ) as stream:
        time.sleep(0.5)  # the long request holds the runner (one at a time); these two queue behind it
        others = [threading.Thread(target=queued_chat), threading.Thread(target=queued_responses)]
        for thread in others:
            thread.start()
        first_output_at: float | None = None
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "text_delta" and event.delta.text:
                first_output_at = first_output_at or time.monotonic()
        message = stream.get_final_message()
    for thread in others:
        thread.join(timeout=120)
    assert first_output_at is not None
    assert message.stop_reason == "max_tokens"
    assert_kept_alive(transport.wire, first_output_at)
    assert_events_kept_alive(transport.wire, first_output_at)
    # The model's text continued the block the keep-alives opened: one text block, every delta of it.
    events = [event for _, event in transport.wire.events()]
    texts = [event["delta"]["text"] for event in events if event["type"] == "content_block_delta"]
    assert {event["index"] for event in events if event["type"].startswith("content_block")} == {0}
    assert content_of(message) == [{"type": "text", "text": "".join(texts)}]
    assert "".join(texts)
    assert check_messages_stream(transport.wire.body()).violations == ()
    # Both queued requests had their headers long before the runner could look at them, and their refusal came as
    # their dialect's error event once it did.
    for dialect in ("chat", "responses"):
        headers_at = outcomes[f"{dialect} headers"]
        assert isinstance(headers_at, float)
        assert headers_at < first_output_at - KEEP_ALIVE_SECONDS / 2
    chat_error = outcomes["chat"]
    assert isinstance(chat_error, openai.APIError)
    assert "context" in str(chat_error.message).lower()
    # Queued for the whole long prefill, the Responses stream was kept alive with real response.in_progress events
    # (Codex CLI's idle timer does not count comment lines), which the SDK parsed.
    responses_events = outcomes["responses"]
    assert isinstance(responses_events, list)
    assert responses_events[:2] == ["response.created", "response.in_progress"]
    assert responses_events[-1] == "response.failed"
    keep_alives = responses_events[2:-1]
    assert keep_alives, "no keep-alive event while queued behind a long prefill"
    assert set(keep_alives) == {"response.in_progress"}
    prompt = message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)
    assert_logged(node.server, "messages", prompt=prompt, finish="length")
    assert_logged(node.server, "chat.completions", finish="error:context_length_exceeded")
    assert_logged(node.server, "responses", finish="error:context_length_exceeded")


def test_a_tool_call_after_a_long_prefill_follows_the_kept_alive_text_block(node: Calibrated) -> None:
    client, transport = recorded_anthropic(node.server)
    # The grammar holds the model to one call of this tool: the first output is the call, not text.
    tool: ToolParam = {
        "name": "answer",
        "description": "Answer yes or no.",
        "input_schema": {
            "type": "object",
            "properties": {"ok": {"type": "boolean"}},
            "required": ["ok"],
            "additionalProperties": False,
        },
    }
    with client.messages.stream(
        model=WIDE_MODEL,
        max_tokens=50,
        tools=[tool],
        tool_choice={"type": "tool", "name": "answer", "disable_parallel_tool_use": True},
        messages=[anthropic_user("anthropic tool", node.sentences)],
    ) as stream:
        first_output_at: float | None = None
        for event in stream:
            if event.type == "content_block_start" and event.content_block.type == "tool_use":
                first_output_at = first_output_at or time.monotonic()
        message = stream.get_final_message()
    assert first_output_at is not None
    assert_kept_alive(transport.wire, first_output_at)
    assert_events_kept_alive(transport.wire, first_output_at)
    events = [event for _, event in transport.wire.events()]
    blocks = [(event["index"], event["content_block"]) for event in events if event["type"] == "content_block_start"]
    assert [(index, block["type"]) for index, block in blocks] == [(0, "text"), (1, "tool_use")]
    # Block 0 got nothing but empty keep-alive deltas (none when the prefill ended before a second keep-alive), and
    # was closed before the call opened block 1.
    assert {event["delta"]["text"] for event in events if event.get("index") == 0 and "delta" in event} <= {""}
    stops = [event["index"] for event in events if event["type"] == "content_block_stop"]
    assert stops == [0, 1]
    arguments = "".join(
        event["delta"]["partial_json"] for event in events if event.get("index") == 1 and "delta" in event
    )
    call = blocks[1][1]
    assert content_of(message) == [
        {"type": "text", "text": ""},
        {"type": "tool_use", "id": call["id"], "name": "answer", "input": json.loads(arguments)},
    ]
    assert isinstance(json.loads(arguments)["ok"], bool)
    assert message.stop_reason == "tool_use"
    assert check_messages_stream(transport.wire.body()).violations == ()


def test_a_refusal_found_before_the_headers_keeps_its_http_status(node: Calibrated) -> None:
    client = node.server.anthropic_client()
    with (
        pytest.raises(anthropic.BadRequestError, match="prompt is too long"),
        client.messages.stream(
            model=MODEL,
            max_tokens=5,
            messages=[anthropic_user("refused", CONTEXT_LENGTH // 10)],
        ) as stream,
    ):
        stream.get_final_message()


def assert_logged(server: ExoServer, dialect: str, *, finish: str, prompt: int | None = None) -> None:
    """The node logged one line for such a request, naming its model, node, tokens, times and ending (`-` for what
    a request refused before its prefill never had)."""
    prompt_pattern = str(prompt) if prompt is not None else r"[\d-]+"
    pattern = (
        rf"request {dialect} model={MODEL} node=\S+ prompt={prompt_pattern} "
        rf"cached=[\d-]+ \(disk [\d-]+\) queue=\S+ prefill=\S+ ttft=\S+ output=\S+ decode=.+ finish={finish}$"
    )
    deadline = time.monotonic() + 5
    while not re.search(pattern, server.log(), re.MULTILINE):
        assert time.monotonic() < deadline, f"no log line matching {pattern!r} in:\n{server.log()[-4000:]}"
        time.sleep(0.2)


def test_a_stream_its_client_abandons_during_prefill_is_logged_as_cancelled(node: Calibrated) -> None:
    body = {"model": MODEL, "input": prompt_text("abandoned", node.sentences), "max_output_tokens": 5, "stream": True}
    with (
        httpx2.Client(base_url=node.server.base_url, timeout=60) as client,
        client.stream("POST", "/v1/responses", json=body) as response,
    ):
        assert response.status_code == 200
        opening = next(response.iter_text())  # the opening events come at admission; then the client leaves
        assert "response.created" in opening
    assert_logged(node.server, "responses", finish="cancelled")
