"""Codex CLI completes one tool round trip through exo's Responses API: real `codex exec`, real HTTP, exo's
production API, master and adapters; only generation is scripted.

Here the runner answers as a model would — an exec_command call streamed in fragments, then, once Codex sent the
command's output back, "Done." — and the real CLI must read exo's events, run the command and finish; the test
sees exactly what reached the runner. A real node and model serve Codex in test_launch_clients.py (`exo launch
codex -- exec …` against tiny-qwen-codex, trained on Codex's trimmed requests, see tests/fixtures/client_requests.py)
and in test_captured_client_requests.py (its captured requests replayed).
"""

from collections.abc import Iterator
from pathlib import Path

import pytest

from exo.shared.types.chunks import Chunk, FinishChunk, TokenChunk, ToolCallArgumentsChunk, ToolCallChunk, Usage
from exo.shared.types.commands import GenerateCommand
from exo.shared.types.common import ToolCallId
from tests.api.inprocess_app import SCRIPTED_MODEL, ScriptedMaster, scripted_app
from tests.clients.agent_cli import run_codex
from tests.clients.installed import require_client
from tests.fixtures.client_requests import CLIENT_TASK
from tests.fixtures.fixture_specs import AGENT_DONE_REPLY
from tests.launch.scripted_api import serving

CLI_TIMEOUT_SECONDS = 180.0
USAGE = Usage(prompt_tokens=900, completion_tokens=20)
EXEC_CALL: tuple[Chunk, ...] = (
    ToolCallChunk(index=0, call_id=ToolCallId("call_" + "x" * 24), name="exec_command"),
    ToolCallArgumentsChunk(index=0, fragment='{"cmd": '),
    ToolCallArgumentsChunk(index=0, fragment='"printf hello > hello.txt"}'),
    FinishChunk(finish_reason="tool_calls", usage=USAGE),
)
DONE: tuple[Chunk, ...] = (TokenChunk(text=AGENT_DONE_REPLY), FinishChunk(finish_reason="stop", usage=USAGE))

pytestmark = [pytest.mark.slow, pytest.mark.npm_clients]


class ToolLoopMaster(ScriptedMaster):
    """Answers like a model doing the task: the call first, the answer once a tool result is in the history."""

    def chunks_for(self, command: GenerateCommand) -> tuple[Chunk, ...]:
        answered = any(message.role == "tool" for message in command.params.messages)
        return DONE if answered else EXEC_CALL


@pytest.fixture
def api() -> Iterator[tuple[str, ToolLoopMaster]]:
    """exo's production app on a real port, its runner scripted."""
    master = ToolLoopMaster()
    app, _ = scripted_app(master=master)
    with serving(app) as root:
        yield f"{root}/v1", master


def test_codex_runs_the_command_through_exo_and_prints_the_final_answer(
    api: tuple[str, ToolLoopMaster], tmp_path: Path
) -> None:
    binary = require_client("codex")
    base_url, master = api
    project, home = tmp_path / "project", tmp_path / "home"
    project.mkdir()
    home.mkdir()
    run = run_codex(
        binary, project, home, base_url=base_url, model=SCRIPTED_MODEL, prompt=CLIENT_TASK, timeout=CLI_TIMEOUT_SECONDS
    )
    assert run.returncode == 0, run.describe()
    written = project / "hello.txt"
    assert written.is_file(), f"Codex did not create hello.txt\n{run.describe()}"
    assert written.read_text() == "hello"
    commands = [(item.get("command"), item.get("exit_code")) for item in run.codex_items("command_execution")]
    assert commands == [("/bin/bash -lc 'printf hello > hello.txt'", 0)], run.describe()
    assert [item.get("text") for item in run.codex_items("agent_message")] == [AGENT_DONE_REPLY], run.describe()
    # Two requests reached the runner: the task, then the history with the call and the command's output.
    assert len(master.tasks) == 2, run.describe()
    second = master.tasks[1].params.messages
    assert [call.name for message in second for call in message.tool_calls] == ["exec_command"]
    assert second[-1].role == "tool"
    assert "Process exited with code 0" in second[-1].content
