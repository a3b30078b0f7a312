"""The opencode coding agent completes one tool call against exo: real opencode, real exo node, real model.

tiny-qwen-agent is trained to answer AGENT_WRITE_REQUEST with a Qwen `<tool_call>` to opencode's `write` tool and,
once the tool result is back, to reply AGENT_DONE_REPLY. opencode must therefore parse exo's streamed tool call,
run the tool (creating the file), send the result back in a second request and print exo's final answer.

The project config gives opencode's build agent a one-line prompt and leaves only its file tools (edit, write) on:
opencode still sends its environment block and the real tool definitions, but the request is ~1.5k tokens instead
of ~14k. A 2-layer fixture model cannot be trained on 14k-token prompts in CPU-minutes (attention costs the square
of the length); docs/OPENCODE.md records the default-config session checked against the default model.
"""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import httpx
import pytest

from tests.clients.opencode_client import OpencodeRun, provider_config, run_opencode
from tests.exo_server import ExoServer, fixture_model, running_exo
from tests.fixtures.fixture_specs import (
    AGENT_DONE_REPLY,
    AGENT_WRITE_REQUEST,
    OPENCODE_REAL_TOOLS,
    OPENCODE_TEST_AGENT_PROMPT,
    OPENCODE_TEST_TOOL_NAMES,
    JsonObject,
)

AGENT_MODEL = "tiny-qwen-agent"
# Enough for the write call and the short reply; a misbehaving model is cut off instead of rambling.
OUTPUT_TOKENS = 256
OPENCODE_TIMEOUT_SECONDS = 200.0

pytestmark = [pytest.mark.slow, pytest.mark.npm_clients]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    with running_exo([fixture_model(AGENT_MODEL)], tmp_path_factory.mktemp("exo-opencode")) as running:
        yield running


def served_context_length(server: ExoServer, model_id: str) -> int:
    """The context length exo reports for `model_id`, so opencode budgets its prompt as exo will."""
    listing = httpx.get(f"{server.base_url}/v1/models", timeout=10).json()
    card = next(card for card in listing["data"] if card["id"] == model_id)
    return int(card["context_length"])


def opencode_session(opencode: Path, server: ExoServer, tmp_path: Path, prompt: str) -> tuple[Path, OpencodeRun]:
    """Run opencode once in a fresh project folder configured for exo; return the folder and what happened."""
    project = tmp_path / "project"
    home = tmp_path / "home"
    project.mkdir()
    home.mkdir()
    all_tools = [str(cast(JsonObject, tool["function"])["name"]) for tool in OPENCODE_REAL_TOOLS]
    config = provider_config(
        f"{server.base_url}/v1",
        AGENT_MODEL,
        served_context_length(server, AGENT_MODEL),
        OUTPUT_TOKENS,
        agent_prompt=OPENCODE_TEST_AGENT_PROMPT,
        disabled_tools=[name for name in all_tools if name not in OPENCODE_TEST_TOOL_NAMES],
    )
    (project / "opencode.json").write_text(json.dumps(config, indent=2))
    run = run_opencode(opencode, project, home, AGENT_MODEL, prompt.split(), timeout=OPENCODE_TIMEOUT_SECONDS)
    return project, run


def test_opencode_writes_the_file_through_exo_and_prints_the_final_answer(
    opencode: Path, server: ExoServer, tmp_path: Path
) -> None:
    project, run = opencode_session(opencode, server, tmp_path, AGENT_WRITE_REQUEST)

    assert run.returncode == 0, run.describe()
    assert [event for event in run.events if event.type == "error"] == [], run.describe()
    written = project / "hello.txt"
    assert written.is_file(), f"opencode did not create hello.txt\n{run.describe()}\n--- exo log\n{server.log()}"
    assert written.read_text() == "hello"
    writes = run.tool_parts("write")
    assert len(writes) == 1, run.describe()
    state = writes[0]["state"]
    assert isinstance(state, dict)
    assert state["status"] == "completed", run.describe()
    assert state["input"] == {"content": "hello", "filePath": "hello.txt"}, run.describe()
    texts = run.texts()
    assert texts, run.describe()
    assert texts[-1].strip() == AGENT_DONE_REPLY, run.describe()
