"""exo's MCP tools through the official `mcp` SDK client, over stdio (`exo mcp`) and over a node's `/mcp`.

One real node serves the tiny tool-calling fixture model behind an API key; every test runs over both transports,
so the two ways of reaching the tools are held to the same answers. Failures must come back as error results the
agent can read, and the server must keep answering after them.
"""

from collections.abc import Iterator
from importlib.metadata import version

import httpx
import pytest
from rich.filesize import decimal

from exo.mcp.inference import RunResult
from exo.mcp.models import ModelsResult
from exo.mcp.status import StatusResult
from exo.models.catalog import CATALOG
from exo.shared.local_backend import local_weights_in_memory
from tests.exo_server import ExoServer, fixture_model, free_port, running_exo
from tests.fixtures.fixture_specs import GREETING_REPLY
from tests.mcp.mcp_clients import TRANSPORTS, McpTransport, exo_mcp_client, text_of

MODEL = "tiny-qwen-tools"
API_KEY = "mcp-test-key"
READ_ONLY_TOOLS = {"exo_status", "exo_list_models", "exo_run_model"}
CHANGING_TOOLS = {"exo_download_model", "exo_place_model"}

both_transports = pytest.mark.parametrize("transport", TRANSPORTS)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    with running_exo([fixture_model(MODEL)], tmp_path_factory.mktemp("exo-mcp"), api_key=API_KEY) as running:
        yield running


@both_transports
async def test_every_tool_is_listed_with_schemas_and_annotations(transport: McpTransport, node: ExoServer) -> None:
    async with exo_mcp_client(transport, node.base_url, API_KEY) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) >= READ_ONLY_TOOLS | CHANGING_TOOLS
    for name, tool in tools.items():
        assert tool.description, name
        assert tool.input_schema["type"] == "object", name
        assert tool.output_schema is not None, name
        assert tool.annotations is not None, name
    for name in READ_ONLY_TOOLS:
        assert tools[name].annotations.read_only_hint is True, name  # pyright: ignore[reportOptionalMemberAccess]
    for name in CHANGING_TOOLS:
        annotations = tools[name].annotations
        assert annotations is not None
        assert annotations.read_only_hint is False, name
        assert tools[name].description.startswith("Changes the cluster:"), name  # pyright: ignore[reportOptionalMemberAccess]
    assert tools["exo_run_model"].input_schema["required"] == ["model", "prompt"]


@both_transports
async def test_status_names_the_node_and_its_ready_model(transport: McpTransport, node: ExoServer) -> None:
    async with exo_mcp_client(transport, node.base_url, API_KEY) as client:
        result = await client.call_tool("exo_status", {})
    assert not result.is_error, result
    status = StatusResult.model_validate(result.structured_content)
    nodes = node.state()["nodes"]
    assert isinstance(nodes, dict)
    assert (status.running, status.api_reachable, status.peers) == (True, True, 0)
    assert status.node_id in nodes
    assert status.master_node_id == status.node_id  # alone, it is its own master
    assert status.version == version("exo")
    assert [(model.model_id, [instance.status for instance in model.instances]) for model in status.models] == [
        (MODEL, ["ready"])
    ]
    assert f"exo {status.version} is up at {status.url}: node {status.node_name} [{status.node_id}] (the master)" in (
        text_of(result)
    )
    assert f"Models: {MODEL} (ready on {status.node_name})." in text_of(result)


@both_transports
async def test_list_models_shows_what_the_runner_loaded(transport: McpTransport, node: ExoServer) -> None:
    async with exo_mcp_client(transport, node.base_url, API_KEY) as client:
        result = await client.call_tool("exo_list_models", {})
    assert not result.is_error, result
    models = ModelsResult.model_validate(result.structured_content)
    served = models.served
    assert [(model.model_id, model.status, model.tool_format) for model in served] == [(MODEL, "ready", "hermes")]
    assert [model.listing.entry.model_id for model in models.catalog.models] == [entry.model_id for entry in CATALOG]
    assert not any(model.listing.downloaded for model in models.catalog.models)  # a fresh models directory
    assert served[0].path == f"<{MODEL}>"  # where it lives on disk is in the node's log, not its API
    assert served[0].context_length is not None
    text = text_of(result)
    assert f"- {MODEL} (ready, context {served[0].context_length}, tool calls as hermes)" in text
    larger = CATALOG[1]
    fit = next(fit for fit in models.fits if fit.model_id == larger.model_id)
    needed = larger.memory_bytes(local_weights_in_memory())
    assert (fit.needed_bytes, fit.fits) == (needed, fit.needed_bytes <= fit.available_bytes)
    verdict = "fits the cluster's free memory" if fit.fits else "does NOT fit the cluster's free memory"
    assert (
        f"- {larger.model_id} ({larger.family} {larger.parameters}, {decimal(larger.source.download_bytes)} download, "
        f"{decimal(larger.disk_bytes)} on disk, needs {decimal(needed)} of memory: {verdict}): "
        "not downloaded"
    ) in text


@both_transports
async def test_run_model_answers_through_the_nodes_own_api(transport: McpTransport, node: ExoServer) -> None:
    async with exo_mcp_client(transport, node.base_url, API_KEY) as client:
        result = await client.call_tool("exo_run_model", {"model": MODEL, "prompt": "Hello!", "temperature": 0})
    assert not result.is_error, result
    run = RunResult.model_validate(result.structured_content)
    assert (run.model, run.content, run.finish_reason, run.tool_calls) == (MODEL, GREETING_REPLY, "stop", [])
    assert run.completion_tokens > 0
    assert run.tokens_per_second > 0
    assert text_of(result).startswith(GREETING_REPLY)
    assert f"{run.completion_tokens} tokens in" in text_of(result)


@both_transports
async def test_failures_are_error_results_and_the_server_keeps_answering(
    transport: McpTransport, node: ExoServer
) -> None:
    async with exo_mcp_client(transport, node.base_url, API_KEY) as client:
        unknown = await client.call_tool("exo_run_model", {"model": "no-such-model", "prompt": "Hi"})
        out_of_range = await client.call_tool("exo_run_model", {"model": MODEL, "prompt": "Hi", "temperature": 5})
        missing = await client.call_tool("exo_run_model", {"prompt": "Hi"})
        after = await client.call_tool("exo_status", {})
    assert unknown.is_error
    assert text_of(unknown) == (
        f"model 'no-such-model' is not served here (served: {MODEL}) "
        "Call exo_list_models to see what exo serves and can fetch."
    )
    assert out_of_range.is_error
    assert "temperature" in text_of(out_of_range)
    assert "less than or equal to 2" in text_of(out_of_range)
    assert missing.is_error
    assert "model" in text_of(missing)
    assert not after.is_error


async def test_exo_down_is_an_error_result_that_says_so(node: ExoServer) -> None:
    # A node that is down serves no /mcp: the stdio server is what an agent talks to then.
    down_url = f"http://127.0.0.1:{free_port()}"
    async with exo_mcp_client("stdio", down_url, API_KEY) as client:
        status = await client.call_tool("exo_status", {})
        models = await client.call_tool("exo_list_models", {})
        run = await client.call_tool("exo_run_model", {"model": MODEL, "prompt": "Hi"})
        listed = await client.list_tools()
    expected = (
        f"exo is not reachable at {down_url} (nothing accepted the connection); is it running? "
        "Start it with `uv run exo`"
    )
    assert (status.is_error, text_of(status)) == (True, expected)
    partial = StatusResult.model_validate(status.structured_content)
    assert (partial.running, partial.api_reachable, partial.url) == (False, False, down_url)
    assert (models.is_error, text_of(models)) == (True, expected)
    assert (run.is_error, text_of(run)) == (True, expected)
    assert {tool.name for tool in listed.tools} >= READ_ONLY_TOOLS  # the server itself is fine
    assert node.process.poll() is None


async def test_a_wrong_api_key_is_an_error_result_naming_the_fix(node: ExoServer) -> None:
    async with exo_mcp_client("stdio", node.base_url, "wrong-key") as client:
        status = await client.call_tool("exo_status", {})
    assert status.is_error
    assert text_of(status) == f"exo at {node.base_url} refused the API key; pass --api-key or set EXO_API_KEY"
    partial = StatusResult.model_validate(status.structured_content)
    assert (partial.running, partial.api_reachable) == (True, False)


@pytest.mark.parametrize("key", [None, "wrong-key"])
def test_the_mcp_endpoint_is_behind_the_api_key(node: ExoServer, key: str | None) -> None:
    headers = {"Accept": "application/json, text/event-stream"} | ({"Authorization": f"Bearer {key}"} if key else {})
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    response = httpx.post(f"{node.base_url}/mcp", json=initialize, headers=headers, timeout=30)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert response.json()["error"]["code"] == "invalid_api_key"
    accepted = httpx.post(
        f"{node.base_url}/mcp", json=initialize, headers=headers | {"Authorization": f"Bearer {API_KEY}"}, timeout=30
    )
    assert accepted.status_code == 200, accepted.text
