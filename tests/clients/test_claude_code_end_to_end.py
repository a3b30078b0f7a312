"""Claude Code completes one tool round trip against exo: real `claude -p`, real exo node, real model.

tiny-qwen-claude-code is trained on Claude Code's requests for "Create the file hello.txt containing hello" (see
tests/fixtures/client_requests.py): it answers with a Write call and, once the tool's result is back, "Done.".
Claude Code must therefore read exo's Messages API stream (the tool_use block and its input_json_delta fragments),
run the tool — creating the file — send the result back in a second request and print exo's final answer.

Claude Code runs trimmed down (a one-line system prompt, only its Write tool), as the opencode test does: a 2-layer
fixture model cannot be trained on its full prompt (24 tools, ~20k tokens) in CPU-minutes. docs/AGENTS.md records
a full session against the default model.
"""

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clients.agent_cli import run_claude_code
from tests.clients.installed import require_client
from tests.exo_server import ExoServer, fixture_model, running_exo
from tests.fixtures.client_requests import CLAUDE_CODE_MODEL, CLIENT_TASK
from tests.fixtures.fixture_specs import AGENT_DONE_REPLY

CLI_TIMEOUT_SECONDS = 300.0

pytestmark = [pytest.mark.slow, pytest.mark.npm_clients]


@pytest.fixture(scope="module")
def claude_code() -> Path:
    return require_client("claude-code")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    with running_exo([fixture_model(CLAUDE_CODE_MODEL)], tmp_path_factory.mktemp("exo-claude-code")) as running:
        yield running


def test_claude_code_writes_the_file_through_exo_and_prints_the_final_answer(
    claude_code: Path, server: ExoServer, tmp_path: Path
) -> None:
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
    )
    assert run.returncode == 0, f"{run.describe()}\n--- exo log\n{server.log()}"
    written = project / "hello.txt"
    assert written.is_file(), f"Claude Code did not create hello.txt\n{run.describe()}\n--- exo log\n{server.log()}"
    assert written.read_text() == "hello"
    assert run.claude_tool_uses() == [("Write", {"file_path": "hello.txt", "content": "hello"})], run.describe()
    results = run.of_type("result")
    assert len(results) == 1, run.describe()
    assert results[0]["is_error"] is False, run.describe()
    assert results[0]["result"] == AGENT_DONE_REPLY, run.describe()
    assert results[0]["num_turns"] == 2, run.describe()
