"""The example agent against a real node: the weather extension's tool called by the model, and exo's MCP tools
loaded over stdio (`exo mcp`) and over the node's `/mcp`, their results and failures reaching the model as text."""

import io
import json
import logging
import shlex
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from textwrap import dedent

import anyio
import pytest

from examples.agent_tools.discovery import discovered_tools
from examples.agent_tools.registry import ToolError, ToolRegistry
from examples.extensions.weather_extension import forecast
from examples.tool_calling_example import main, run_agent
from exo.mcp.node_client import NodeClient
from exo.mcp.server import build_server
from tests.exo_server import ExoServer, fixture_model, free_port, running_exo

MODEL = "tiny-qwen-tools"
API_KEY = "agent-test-key"
WEATHER_COMMAND = shlex.join(
    [sys.executable, str(Path(__file__).resolve().parents[2] / "examples" / "extensions" / "weather_extension.py")]
)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    with running_exo([fixture_model(MODEL)], tmp_path_factory.mktemp("exo-agent"), api_key=API_KEY) as running:
        yield running


def exo_tool_names() -> list[str]:
    """exo's MCP tools in the order the server lists them."""
    server = build_server(NodeClient())
    return [tool.name for tool in anyio.run(server.list_tools)]


def exo_mcp_command(url: str) -> str:
    return shlex.join([sys.executable, "-m", "exo", "mcp", "--url", url, "--api-key", API_KEY])


def test_the_model_calls_the_extensions_weather_tool_and_reads_its_result(node: ExoServer) -> None:
    client = node.openai_client().with_options(api_key=API_KEY)
    output = io.StringIO()
    with discovered_tools(ToolRegistry(), extensions=[WEATHER_COMMAND]) as registry:
        result = run_agent(client, MODEL, "What is the weather in Paris?", registry, max_turns=2, output=output)
    first = result.tool_runs[0]
    assert (first.name, json.loads(first.arguments), first.ok) == ("get_weather", {"city": "Paris"}, True)
    assert json.loads(first.result) == forecast("Paris")
    assert f"← {first.result}" in output.getvalue()


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_exo_mcp_tools_load_into_the_agent_and_answer_through_it(node: ExoServer, transport: str) -> None:
    spec = exo_mcp_command(node.base_url) if transport == "stdio" else f"{node.base_url}/mcp"
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with discovered_tools(ToolRegistry(), mcp_servers=[spec], mcp_headers=headers) as registry:
        assert registry.names() == exo_tool_names()
        status = registry.run("exo_status", "{}")
        run = registry.run("exo_run_model", json.dumps({"model": MODEL, "prompt": "Hello!", "temperature": 0}))
        unknown = registry.run("exo_run_model", '{"model": "no-such-model", "prompt": "Hi"}')
        invalid = registry.run("exo_run_model", '{"model": "x"}')
    assert status.ok, status.result
    assert status.result.startswith(f"exo {version('exo')} is up at {node.base_url}: node ")
    assert run.ok, run.result
    assert run.result.startswith("Hello! How can I help you today?")
    assert (unknown.ok, ToolError.model_validate_json(unknown.result).error) == (False, "tool_failed")
    assert "model 'no-such-model' is not served here" in unknown.result
    # Checked against the tool's declared schema before anything is sent to the server.
    invalid_error = ToolError.model_validate_json(invalid.result)
    assert (invalid_error.error, invalid_error.message.split(" (")[0]) == (
        "invalid_arguments",
        "arguments: 'prompt' is a required property",
    )


def test_mcp_servers_that_cannot_be_reached_are_skipped(caplog: pytest.LogCaptureFixture) -> None:
    closed = f"http://127.0.0.1:{free_port()}/mcp"
    with (
        caplog.at_level(logging.WARNING),
        discovered_tools(
            ToolRegistry(), mcp_servers=[closed, "/nonexistent/mcp-server"], extensions=[WEATHER_COMMAND]
        ) as registry,
    ):
        assert registry.names() == ["get_weather"]
    assert f"skipping MCP server '{closed}': cannot reach it" in caplog.text
    assert "skipping MCP server '/nonexistent/mcp-server': cannot reach it" in caplog.text


def test_a_slow_mcp_tool_times_out_and_the_server_stays_usable(tmp_path: Path) -> None:
    script = tmp_path / "slow_server.py"
    script.write_text(
        dedent(
            """
            import anyio
            from mcp.server.mcpserver import MCPServer

            server = MCPServer("slow")

            @server.tool()
            async def slow(seconds: float) -> str:
                \"\"\"Sleep, then answer.\"\"\"
                await anyio.sleep(seconds)
                return "woke up"

            server.run()
            """
        )
    )
    spec = shlex.join([sys.executable, str(script)])
    with discovered_tools(ToolRegistry(), mcp_servers=[spec], call_timeout_seconds=2.0) as registry:
        late = registry.run("slow", '{"seconds": 30}')
        quick = registry.run("slow", '{"seconds": 0}')
    assert ToolError.model_validate_json(late.result) == ToolError(
        error="timeout", message="slow (MCP) did not answer within 2s"
    )
    assert (quick.ok, quick.result) == (True, "woke up")


def test_the_command_line_loads_every_tool_source(node: ExoServer, capsys: pytest.CaptureFixture[str]) -> None:
    mcp = ["--mcp", f"{node.base_url}/mcp", "--mcp-header", f"Authorization: Bearer {API_KEY}"]
    common = ["--base-url", f"{node.base_url}/v1", "--api-key", API_KEY, "--tools", "--extension", WEATHER_COMMAND]
    assert main([*common, *mcp, "--tools", "get_time", "--max-turns", "0"]) == 1  # no turn: nothing answered
    assert f"tools: get_time, get_weather, {', '.join(exo_tool_names())}\n" in capsys.readouterr().err
    # The fixture model was trained with get_weather alone in its prompt, so the model-driven run offers only it.
    assert main([*common, "--max-turns", "1"]) == 1  # the one turn allowed went to the call
    printed = capsys.readouterr().out
    assert '→ get_weather({"city": "Paris"})' in printed
    assert f"← {json.dumps(forecast('Paris'))}" in printed
