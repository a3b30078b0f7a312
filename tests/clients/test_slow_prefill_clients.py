"""Real clients whose prompt takes longer to read than they wait for headers or for the next chunk: no timeout,
no retry, and the keep-alives parse.

The long-context fixture model of tests/api/test_long_prefill_streams.py serves a node whose runner is told to
take at least SECONDS_PER_TOKEN per prompt token (the debugging setting SLOW_PREFILL_VARIABLE, which holds each
prefill piece back in short steps): the words alone then take 2 x KEEP_ALIVE_SECONDS to read, each client's own
instructions longer, on a fast machine or a busy one alike, while the model's real work stays a few seconds. (The
prompt was once sized from a timed first request; its prefill then followed the machine's load, and Codex's test
failed twice.) Each client's header timeout is cut to
HEADER_TIMEOUT_MS: opencode's provider option `headerTimeout` (its `chunkTimeout` too, to a few seconds over the
keep-alive interval), Claude Code's API_TIMEOUT_MS, which its SDK applies until the response headers arrive, and
Codex CLI's stream idle timeout (cut to CODEX_IDLE_TIMEOUT_MS), which only SSE events reset. exo sends the headers
when it admits a request and a keep-alive every KEEP_ALIVE_SECONDS while the prompt is read (a comment line; on
Messages also an empty text block, then empty deltas of it; on Responses a `response.in_progress` event), so the
client's first request is read past its prefill, none is cancelled or sent again, and opencode and Claude Code end
normally. (Claude Code's stream watchdog, which counts Messages events, cannot be set below 5 minutes, so here its
parse of the keep-alive events is checked; docs/AGENTS.md records a by-hand run past the watchdog.) The model
writes free text up to the clients' output limit; what matters is the stream, not the words.
"""

import itertools
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from exo.api.answer_stream import KEEP_ALIVE_SECONDS
from exo.conformance.json_view import JsonMapping, as_object
from exo.worker.engines.mlx.generator.prefill import SLOW_PREFILL_VARIABLE
from tests.api.test_long_prefill_streams import CONTEXT_LENGTH, prompt_text, running_tasks
from tests.clients.agent_cli import CliRun, run_claude_code, run_codex
from tests.clients.installed import require_client
from tests.clients.opencode_client import provider_config, run_opencode
from tests.exo_server import ExoServer, running_exo
from tests.fixtures.endless_model import MODEL as LONG_MODEL
from tests.fixtures.endless_model import endless_copy
from tests.fixtures.fixture_specs import OPENCODE_REAL_TOOLS, OPENCODE_TEST_AGENT_PROMPT, JsonObject

pytestmark = pytest.mark.npm_clients

# The clients' header timeouts, cut from minutes; exo sends headers within a second of admission.
HEADER_TIMEOUT_MS = 5000
OUTPUT_TOKENS = 16
# Codex CLI gives up on a stream when no SSE event (comments do not count) arrives for this long; cut from 5 minutes.
CODEX_IDLE_TIMEOUT_MS = int(KEEP_ALIVE_SECONDS * 1000) + 5000
# The words given to each client (a sentence is 11 tokens), and the least each prompt token takes to prefill: the
# words alone take twice the keep-alive interval, and every client adds its own instructions (Codex about 2,800
# tokens, so about 37 s in all, past CODEX_IDLE_TIMEOUT_MS).
PROMPT_SENTENCES = 300
SECONDS_PER_TOKEN = 2 * KEEP_ALIVE_SECONDS / (PROMPT_SENTENCES * 11)
# Codex asks for no output limit, so it is stopped once it has read the answer for this long (the node's /state
# shows the request decoding), or at the latest after CODEX_RUN_SECONDS.
CODEX_READS_ANSWER_SECONDS = 3.0
CODEX_RUN_SECONDS = 120.0
CLI_TIMEOUT_SECONDS = 280.0
# A stopped client's request is logged once the node notices the closed connection and the runner ends it.
LOGGED_WITHIN_SECONDS = 15.0


def request_lines(server: ExoServer, dialect: str, model: str) -> list[str]:
    return re.findall(rf"request {dialect} model={model} .*", server.log())


def request_lines_after(server: ExoServer, dialect: str, model: str, before: int) -> list[str]:
    """The request lines logged after the first `before`, once at least one is there (waiting up to
    LOGGED_WITHIN_SECONDS), and a second more for any that follows it."""
    deadline = time.monotonic() + LOGGED_WITHIN_SECONDS
    while not request_lines(server, dialect, model)[before:] and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    return request_lines(server, dialect, model)[before:]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    """The long-context model on a node that reads prompts slowly on purpose, one request at a time."""
    directory = tmp_path_factory.mktemp("keep-alive-clients")
    models = [endless_copy(directory, context_length=CONTEXT_LENGTH)]
    slow_prefill = {SLOW_PREFILL_VARIABLE: str(SECONDS_PER_TOKEN)}
    with running_exo(models, directory, ["--batch-size", "1"], slow_prefill) as server:
        yield server


def test_opencode_reads_keep_alives_through_a_prefill_longer_than_their_interval(
    node: ExoServer, tmp_path: Path
) -> None:
    opencode = require_client("opencode")
    project, home = tmp_path / "project", tmp_path / "home"
    project.mkdir()
    home.mkdir()
    all_tools = [str(cast(JsonObject, tool["function"])["name"]) for tool in OPENCODE_REAL_TOOLS]
    config = provider_config(
        f"{node.base_url}/v1",
        LONG_MODEL,
        CONTEXT_LENGTH,
        OUTPUT_TOKENS,
        agent_prompt=OPENCODE_TEST_AGENT_PROMPT,
        disabled_tools=all_tools,
        provider_options={"headerTimeout": HEADER_TIMEOUT_MS, "chunkTimeout": int(KEEP_ALIVE_SECONDS * 1000) + 5000},
    )
    (project / "opencode.json").write_text(json.dumps(config))
    words = prompt_text("opencode", PROMPT_SENTENCES).split()
    before = len(request_lines(node, "chat.completions", LONG_MODEL))
    run = run_opencode(opencode, project, home, LONG_MODEL, words, timeout=CLI_TIMEOUT_SECONDS)
    assert run.returncode == 0, f"{run.describe()}\n--- exo log\n{node.log()}"
    assert [event for event in run.events if event.type == "error"] == [], run.describe()
    assert run.texts(), run.describe()
    assert_kept_alive_once(request_lines(node, "chat.completions", LONG_MODEL)[before:])


def test_claude_code_reads_keep_alives_through_a_prefill_longer_than_their_interval(
    node: ExoServer, tmp_path: Path
) -> None:
    claude_code = require_client("claude-code")
    project, home = tmp_path / "project", tmp_path / "home"
    project.mkdir()
    home.mkdir()
    run = run_claude_code(
        claude_code,
        project,
        home,
        base_url=node.base_url,
        model=LONG_MODEL,
        prompt=prompt_text("claude code", PROMPT_SENTENCES),
        timeout=CLI_TIMEOUT_SECONDS,
        environment={
            "API_TIMEOUT_MS": str(HEADER_TIMEOUT_MS),
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(OUTPUT_TOKENS),
        },
        extra_arguments=["--include-partial-messages"],  # Claude Code prints each stream event it parsed
    )
    assert len(run.of_type("result")) == 1, f"{run.describe()}\n--- exo log\n{node.log()}"
    assert not [event for event in run.of_type("system") if event.get("subtype") == "api_retry"], run.describe()
    # Claude Code asks the model to go on after an answer cut at its output limit (a few times): each of those
    # requests extends the long prompt, which the prefix cache holds, so only the first one reads it.
    lines = request_lines(node, "messages", LONG_MODEL)
    long_prompt = PROMPT_SENTENCES * 11
    first_long = next(
        line for line in lines if (tokens := re.search(r"prompt=(\d+)", line)) and int(tokens[1]) > long_prompt
    )
    assert_kept_alive_once([first_long])
    assert not [line for line in lines if line.endswith("finish=cancelled")], "\n".join(lines)
    # Claude Code's stream watchdog counts events other than `ping`: during the prefill exo's keep-alives were an
    # empty text block and empty deltas of it, which Claude Code parsed, and the model's text went on in that block.
    events = first_stream(run)
    assert events[0]["type"] == "message_start"
    assert events[1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": "", "citations": None},
    }
    deltas = [event for event in events if event["type"] == "content_block_delta"]
    keep_alives = list(itertools.takewhile(lambda event: event["delta"] == {"type": "text_delta", "text": ""}, deltas))
    prefill = float(re.findall(r"prefill=([\d.]+)s", first_long)[0])
    assert 1 + len(keep_alives) >= int(prefill // KEEP_ALIVE_SECONDS) - 1, (prefill, keep_alives)
    written = deltas[len(keep_alives) :]
    assert written, events
    assert {event["index"] for event in deltas} == {0}
    assert [event["type"] for event in events if event["type"] in ("content_block_start", "content_block_stop")] == [
        "content_block_start",
        "content_block_stop",
    ]


def first_stream(run: CliRun) -> list[JsonMapping]:
    """The Messages events of Claude Code's first request, as it printed them (`stream_event` lines)."""
    events = [as_object(event.get("event")) or {} for event in run.of_type("stream_event")]
    end = next(position for position, event in enumerate(events) if event.get("type") == "message_stop")
    return events[: end + 1]


def test_codex_reads_keep_alive_events_through_a_prefill_longer_than_its_idle_timeout(
    node: ExoServer, tmp_path: Path
) -> None:
    codex = require_client("codex")
    project, home = tmp_path / "project", tmp_path / "home"
    project.mkdir()
    home.mkdir()
    before = len(request_lines(node, "responses", LONG_MODEL))
    # Codex asks for no output limit, so the fixture would write until its context is full: Codex is stopped once
    # it has read the answer for CODEX_READS_ANSWER_SECONDS, past the prefill, and the node logs its request then.
    decoding_since: list[float] = []

    def read_the_answer_a_while() -> bool:
        if not decoding_since and any(task.get("phase") == "decode" for task in running_tasks(node)):
            decoding_since.append(time.monotonic())
        return bool(decoding_since) and time.monotonic() - decoding_since[0] >= CODEX_READS_ANSWER_SECONDS

    run = run_codex(
        codex,
        project,
        home,
        base_url=f"{node.base_url}/v1",
        model=LONG_MODEL,
        prompt=prompt_text("codex", PROMPT_SENTENCES),
        timeout=CODEX_RUN_SECONDS,
        stream_idle_timeout_ms=CODEX_IDLE_TIMEOUT_MS,
        stop_when=read_the_answer_a_while,
    )
    # The node logs the request when it ends: here when it notices that Codex, stopped, closed the connection, a
    # moment after `run_codex` returns (reading the log at once found no line in a full CI run).
    lines = request_lines_after(node, "responses", LONG_MODEL, before)
    # One request: Codex did not give up during the prefill and send it again, although the prefill took longer
    # than Codex waits for an event; it was still reading the answer when it was stopped.
    assert len(lines) == 1, f"{lines}\n{run.describe()}"
    prefill = float(re.findall(r"prefill=([\d.]+)s", lines[0])[0])
    assert prefill > CODEX_IDLE_TIMEOUT_MS / 1000, f"the prompt took only {prefill:.1f} s: shorter than the timeout"
    assert re.search(r"ttft=[\d.]+s", lines[0]), lines[0]  # the answer had begun


def assert_kept_alive_once(lines: list[str]) -> None:
    """One request (none cancelled or retried), read to its output limit, whose prefill outlasted the keep-alive
    interval."""
    assert len(lines) == 1, lines
    assert lines[0].endswith("finish=length"), lines
    prefill = float(re.findall(r"prefill=([\d.]+)s", lines[0])[0])
    assert prefill > KEEP_ALIVE_SECONDS + 1, f"the prompt took only {prefill:.1f} s: too short to test keep-alives"
