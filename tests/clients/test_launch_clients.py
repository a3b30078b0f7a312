"""`exo launch` runs each real client (pinned versions) to the end of a tool-calling task, configured by the launch.

Each test gives the launch nothing but the node's URL and the client's words after `--`; the provider, model,
timeouts, permissions, sandbox and git check come from `exo launch`. The project or the words hold only what trims
the client to the prompt its fixture was trained on (as in the other tests of this folder): for opencode a project
opencode.json with the one-line agent and its two file tools, for Claude Code `--system-prompt` and `--tools`, for
Codex `-c` overrides after `exec` (CODEX_TRIM_OVERRIDES: one-line instructions, no permissions or environment
messages, only its exec_command and write_stdin tools).

Each runs against a real node serving a fixture model trained on its client's requests; Codex inside the
workspace-write sandbox the launch sets, in a folder that is no git repository.
"""

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from exo.conformance.json_view import as_object
from tests.clients.agent_cli import CliRun, isolated_environment, run_cli
from tests.clients.headless import run_headless
from tests.clients.installed import require_client
from tests.clients.opencode_client import isolated_environment as opencode_environment
from tests.clients.opencode_client import parsed_run
from tests.exo_server import ExoServer, fixture_model, running_exo
from tests.fixtures.client_requests import (
    CLAUDE_CODE_MODEL,
    CLIENT_AGENT_PROMPT,
    CLIENT_TASK,
    CODEX_MODEL,
    CODEX_TRIM_OVERRIDES,
)
from tests.fixtures.fixture_specs import (
    AGENT_DONE_REPLY,
    AGENT_WRITE_REQUEST,
    OPENCODE_REAL_TOOLS,
    OPENCODE_TEST_AGENT_PROMPT,
    OPENCODE_TEST_TOOL_NAMES,
    JsonObject,
)

OPENCODE_MODEL = "tiny-qwen-agent"
CLI_TIMEOUT_SECONDS = 300.0

pytestmark = pytest.mark.slow


def _launch(client: str, url: str, binary: Path, client_words: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "exo",
        "launch",
        client,
        "--url",
        url,
        "--client-bin",
        str(binary),
        "--",
        *client_words,
    ]


def _folders(tmp_path: Path) -> tuple[Path, Path]:
    project, home = tmp_path / "project", tmp_path / "home"
    project.mkdir()
    home.mkdir()
    return project, home


@pytest.fixture(scope="module")
def opencode_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    with running_exo([fixture_model(OPENCODE_MODEL)], tmp_path_factory.mktemp("exo-launch-opencode")) as running:
        yield running


@pytest.fixture(scope="module")
def claude_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    with running_exo([fixture_model(CLAUDE_CODE_MODEL)], tmp_path_factory.mktemp("exo-launch-claude")) as running:
        yield running


@pytest.fixture(scope="module")
def codex_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    with running_exo([fixture_model(CODEX_MODEL)], tmp_path_factory.mktemp("exo-launch-codex")) as running:
        yield running


def test_exo_launch_opencode_run_writes_the_file(opencode: Path, opencode_node: ExoServer, tmp_path: Path) -> None:
    project, home = _folders(tmp_path)
    all_tools = [str(cast(JsonObject, tool["function"])["name"]) for tool in OPENCODE_REAL_TOOLS]
    trimmed = {
        "$schema": "https://opencode.ai/config.json",  # opencode adds it to a project file that lacks it
        "agent": {"title": {"disable": True}, "build": {"prompt": OPENCODE_TEST_AGENT_PROMPT}},
        "tools": {name: False for name in all_tools if name not in OPENCODE_TEST_TOOL_NAMES},
    }
    (project / "opencode.json").write_text(json.dumps(trimmed))
    environment = opencode_environment(home) | {"EXO_HOME": str(home / "exo")}

    run = parsed_run(
        run_headless(
            _launch(
                "opencode", opencode_node.base_url, opencode, ["run", "--format", "json", *AGENT_WRITE_REQUEST.split()]
            ),
            project,
            environment,
            CLI_TIMEOUT_SECONDS,
        )
    )

    assert run.returncode == 0, f"{run.describe()}\n--- exo log\n{opencode_node.log()}"
    assert [event for event in run.events if event.type == "error"] == [], run.describe()
    assert (project / "hello.txt").read_text() == "hello", run.describe()
    writes = run.tool_parts("write")
    assert len(writes) == 1, run.describe()
    state = writes[0]["state"]
    assert isinstance(state, dict)
    assert state["status"] == "completed", run.describe()  # written without a permission prompt
    assert run.texts()[-1].strip() == AGENT_DONE_REPLY, run.describe()
    # The project's own file is as the user left it; the launch's configuration lives under EXO_HOME.
    assert json.loads((project / "opencode.json").read_text()) == trimmed
    (written,) = (home / "exo" / "launch" / "opencode").iterdir()
    assert written.name.startswith("opencode-")


def test_exo_launch_claude_p_writes_the_file(claude_node: ExoServer, tmp_path: Path) -> None:
    binary = require_client("claude-code")
    project, home = _folders(tmp_path)
    environment = isolated_environment(home, {"EXO_HOME": str(home / "exo"), "DISABLE_AUTOUPDATER": "1"})
    words = [
        "-p",
        CLIENT_TASK,
        "--system-prompt",
        CLIENT_AGENT_PROMPT,
        "--tools",
        "Write",
        "--permission-mode",
        "acceptEdits",
        "--output-format",
        "stream-json",
        "--verbose",
    ]

    run: CliRun = run_cli(
        _launch("claude", claude_node.base_url, binary, words), project, environment, CLI_TIMEOUT_SECONDS
    )

    assert run.returncode == 0, f"{run.describe()}\n--- exo log\n{claude_node.log()}"
    assert (project / "hello.txt").read_text() == "hello", run.describe()
    assert run.claude_tool_uses() == [("Write", {"file_path": "hello.txt", "content": "hello"})], run.describe()
    init = run.of_type("system")[0]
    assert init["model"] == CLAUDE_CODE_MODEL, run.describe()  # the model came from the launch's environment
    (result,) = run.of_type("result")
    assert (result["is_error"], result["result"], result["num_turns"]) == (False, AGENT_DONE_REPLY, 2), run.describe()


def test_exo_launch_codex_exec_runs_the_command(codex_node: ExoServer, tmp_path: Path) -> None:
    binary = require_client("codex")
    project, home = _folders(tmp_path)
    instructions = home / "instructions.md"
    instructions.write_text(CLIENT_AGENT_PROMPT)
    environment = isolated_environment(home, {"EXO_HOME": str(home / "exo")})
    trim = [
        word.replace("@instructions@", str(instructions))
        for override in CODEX_TRIM_OVERRIDES
        for word in ("-c", override)
    ]

    run = run_cli(
        _launch("codex", codex_node.base_url, binary, ["exec", *trim, "--json", CLIENT_TASK]),
        project,
        environment,
        CLI_TIMEOUT_SECONDS,
    )

    assert run.returncode == 0, f"{run.describe()}\n--- exo log\n{codex_node.log()}"
    assert (project / "hello.txt").read_text() == "hello", run.describe()
    commands = [(item.get("command"), item.get("exit_code")) for item in run.codex_items("command_execution")]
    assert commands == [("/bin/bash -lc 'printf hello > hello.txt'", 0)], run.describe()
    assert [item.get("text") for item in run.codex_items("agent_message")] == [AGENT_DONE_REPLY], run.describe()
    # The turn's two requests were answered by the node (Codex sums their token counts).
    (completed,) = run.of_type("turn.completed")
    usage = as_object(completed.get("usage")) or {}
    counts = [usage.get("input_tokens"), usage.get("output_tokens")]
    assert all(isinstance(count, int) and count > 0 for count in counts), run.describe()
    # Codex's own config folder was never written to by the launch.
    assert not (home / ".codex" / "config.toml").exists()
