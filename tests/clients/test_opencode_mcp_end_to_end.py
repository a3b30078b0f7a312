"""opencode looks after exo through exo's own MCP server: real opencode, a real node, a real model, `exo mcp`.

opencode.json names `exo mcp --url <node>` as a local MCP server (as docs/AGENT_TOOLS.md tells users to) and routes
the model to the same node's chat API. tiny-qwen-mcp is trained on opencode's requests for "Is exo up?" (with every
tool but exo's status switched off): it calls `exo_exo_status`, and once the result is back answers
OPENCODE_MCP_REPLY. So opencode must start exo's MCP server, offer its tool to the model, parse exo's streamed call,
run it through MCP against the node, and send the tool's text result back: the transcript shows it.
"""

import json
import re
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import cast

import pytest

from tests.clients.opencode_client import PROVIDER_ID, provider_config, run_opencode
from tests.clients.test_opencode_end_to_end import served_context_length
from tests.exo_server import ExoServer, fixture_model, running_exo
from tests.fixtures.client_requests import (
    OPENCODE_MCP_AGENT_PROMPT,
    OPENCODE_MCP_MODEL,
    OPENCODE_MCP_PROMPT,
    OPENCODE_MCP_REPLY,
    OPENCODE_MCP_TOOL,
    OPENCODE_MCP_TOOLS,
)
from tests.fixtures.fixture_specs import JsonObject

OUTPUT_TOKENS = 256
OPENCODE_TIMEOUT_SECONDS = 240.0

pytestmark = [pytest.mark.slow, pytest.mark.npm_clients]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    with running_exo([fixture_model(OPENCODE_MCP_MODEL)], tmp_path_factory.mktemp("exo-opencode-mcp")) as running:
        yield running


def opencode_config(server: ExoServer) -> JsonObject:
    """The provider entry of the opencode test, plus exo's MCP server as docs/AGENT_TOOLS.md configures it."""
    config = provider_config(
        f"{server.base_url}/v1",
        OPENCODE_MCP_MODEL,
        served_context_length(server, OPENCODE_MCP_MODEL),
        OUTPUT_TOKENS,
        agent_prompt=OPENCODE_MCP_AGENT_PROMPT,
    )
    config.pop("permission")  # no file edits wanted: with edit allowed, opencode keeps its edit and write tools on
    server_entry: JsonObject = {
        "type": "local",
        "command": [sys.executable, "-m", "exo", "mcp", "--url", server.base_url],
        "enabled": True,
    }
    config["tools"] = OPENCODE_MCP_TOOLS
    config["mcp"] = {PROVIDER_ID: server_entry}
    return config


def test_opencode_calls_exos_status_tool_over_mcp_and_answers_from_it(
    opencode: Path, server: ExoServer, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    home = tmp_path / "home"
    project.mkdir()
    home.mkdir()
    (project / "opencode.json").write_text(json.dumps(opencode_config(server), indent=2))

    run = run_opencode(
        opencode, project, home, OPENCODE_MCP_MODEL, OPENCODE_MCP_PROMPT.split(), timeout=OPENCODE_TIMEOUT_SECONDS
    )

    assert run.returncode == 0, run.describe()
    assert [event for event in run.events if event.type == "error"] == [], run.describe()
    calls = run.tool_parts(OPENCODE_MCP_TOOL)
    assert len(calls) == 1, f"{run.describe()}\n--- exo log\n{server.log()}"
    state = calls[0]["state"]
    assert isinstance(state, dict), run.describe()
    assert (state["status"], state["input"]) == ("completed", {}), run.describe()
    # exo_status's own text, from the node that serves the model: the tool really ran against exo.
    status = re.fullmatch(
        rf"exo {re.escape(version('exo'))} is up at {re.escape(server.base_url)}: node (?P<name>\S+) "
        r"\[(?P<node_id>[0-9a-f]+)\] \(the master\) in cluster 'test-[0-9a-f]+', 0 peer\(s\) up\.\n"
        rf"Models: {OPENCODE_MCP_MODEL} \(ready on (?P=name)\)\.",
        str(state["output"]),
    )
    assert status is not None, run.describe()
    assert status["node_id"] in cast(JsonObject, server.state()["nodes"])
    texts = run.texts()
    assert texts, run.describe()
    assert texts[-1].strip() == OPENCODE_MCP_REPLY, run.describe()
