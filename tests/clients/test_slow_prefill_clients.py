"""Real clients whose prompt takes longer to read than they wait for response headers: no timeout, no retry.

The fixture models trained on opencode's and Claude Code's requests are deepened (tests/fixtures/deepened_model.py:
extra layers that add nothing to the residual stream, so every answer stays the same) until reading the clients'
prompts takes seconds, and each client's header timeout is cut to HEADER_TIMEOUT_MS: opencode's provider option
`headerTimeout`, and Claude Code's API_TIMEOUT_MS, which its SDK applies until the response headers arrive. exo
sends the headers when it admits a request and keep-alive comments while the prompt is read, so each client makes
exactly the requests of its session (none aborted, none retried) and finishes its task.
"""

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from exo.shared.types.common import ModelId
from tests.clients.agent_cli import run_claude_code
from tests.clients.installed import require_client
from tests.clients.test_opencode_end_to_end import AGENT_MODEL, opencode_session
from tests.exo_server import ExoServer, running_exo
from tests.fixtures.client_requests import CLAUDE_CODE_MODEL, CLIENT_TASK
from tests.fixtures.deepened_model import deepened_copy
from tests.fixtures.fixture_specs import AGENT_DONE_REPLY, AGENT_WRITE_REQUEST, JsonObject

HEADER_TIMEOUT_MS = 1000
# Layers in all (the trained models have 2), so that each client's first prompt takes about 6 s to read on a busy
# 2-core machine (measured with 24 layers: opencode's 1,257 tokens in 1.0 s, Claude Code's 355 in 0.2 s).
LAYERS = {AGENT_MODEL: 150, CLAUDE_CODE_MODEL: 700}
CLI_TIMEOUT_SECONDS = 400.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    directory = tmp_path_factory.mktemp("slow-prefill-clients")
    models = [deepened_copy(directory, name, layers) for name, layers in LAYERS.items()]
    with running_exo(models, directory, ready_timeout=180) as running:
        yield running


def request_lines(server: ExoServer, dialect: str, model: ModelId | str) -> list[str]:
    return re.findall(rf"request {dialect} model={model} .*", server.log())


def assert_served_once_each(lines: list[str], requests: int) -> None:
    """`requests` requests, none cancelled (an aborted or retried request leaves a `cancelled` line), and at least
    one whose prefill outlasted the client's header timeout."""
    assert len(lines) == requests, lines
    assert all(line.endswith(("finish=stop", "finish=tool_calls")) for line in lines), lines
    prefills = [float(match) for line in lines for match in re.findall(r"prefill=([\d.]+)s", line)]
    assert max(prefills) > HEADER_TIMEOUT_MS / 1000, f"no prefill outlasted the header timeout: {lines}"


def test_opencode_finishes_without_a_retry_when_reading_its_prompt_outlasts_its_header_timeout(
    server: ExoServer, tmp_path: Path
) -> None:
    opencode = require_client("opencode")
    options: JsonObject = {"headerTimeout": HEADER_TIMEOUT_MS}
    project, run = opencode_session(opencode, server, tmp_path, AGENT_WRITE_REQUEST, provider_options=options)
    assert run.returncode == 0, f"{run.describe()}\n--- exo log\n{server.log()}"
    assert [event for event in run.events if event.type == "error"] == [], run.describe()
    assert (project / "hello.txt").read_text() == "hello"
    assert run.texts()[-1].strip() == AGENT_DONE_REPLY, run.describe()
    assert_served_once_each(request_lines(server, "chat.completions", AGENT_MODEL), requests=2)


def test_claude_code_finishes_without_a_retry_when_reading_its_prompt_outlasts_its_api_timeout(
    server: ExoServer, tmp_path: Path
) -> None:
    claude_code = require_client("claude-code")
    project, home = tmp_path / "project", tmp_path / "home"
    project.mkdir()
    home.mkdir()
    run = run_claude_code(
        claude_code,
        project,
        home,
        base_url=server.base_url,
        model=CLAUDE_CODE_MODEL,
        prompt=CLIENT_TASK,
        timeout=CLI_TIMEOUT_SECONDS,
        environment={"API_TIMEOUT_MS": str(HEADER_TIMEOUT_MS)},
    )
    assert run.returncode == 0, f"{run.describe()}\n--- exo log\n{server.log()}"
    assert (project / "hello.txt").read_text() == "hello"
    results = run.of_type("result")
    assert [(result["is_error"], result["result"]) for result in results] == [(False, AGENT_DONE_REPLY)]
    assert_served_once_each(request_lines(server, "messages", CLAUDE_CODE_MODEL), requests=2)
