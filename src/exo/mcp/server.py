"""The exo MCP server: each tool is a typed function of the node client, given MCP annotations and two results.

Every tool answers with a structured result (its JSON schema is the tool's output schema) and a readable text of the
same facts. Every failure — exo down, the API key refused, an unknown node or model, a model too large for the
cluster — is an error result whose text says what is wrong and what to do; the server itself never fails a call.
"""

import inspect
import re
from collections.abc import Awaitable, Callable
from importlib.metadata import version
from typing import Annotated, Any, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from exo.mcp.cluster import (
    ClusterInfo,
    ShardDistribution,
    cluster_info,
    describe_cluster,
    describe_node_health,
    describe_nodes,
    describe_shards,
    list_nodes,
    node_health,
    shard_distribution,
)
from exo.mcp.failures import ToolFailedError
from exo.mcp.inference import DEFAULT_MAX_TOKENS, RunResult, run_model
from exo.mcp.metrics import DEFAULT_SAMPLE_SECONDS, PerformanceMetrics, describe_performance, performance_metrics
from exo.mcp.models import ModelsResult, describe_download, download_model, list_models
from exo.mcp.node_client import NodeApiError, NodeClient, NodeUnreachableError
from exo.mcp.peers import Discovery, add_peer, describe_discovery, describe_peer, discover
from exo.mcp.placement import describe_placement, place_model
from exo.mcp.status import StatusResult, status
from exo.models.catalog_api import DownloadDone
from exo.shared.types.cluster_api import ClusterNode, ClusterNodeList, PeerConnection, PlacedInstanceView
from exo.shared.types.worker.shards import ParallelChoice

INSTRUCTIONS = (
    "Tools to look after an exo cluster (LLM inference on MLX across machines): check that exo is up, read its "
    "nodes, memory, models and metrics, fetch and run models, add nodes. Check the cluster's free memory "
    "(exo_cluster_info) before running or fetching a large model."
)


Result = TypeVar("Result", bound=BaseModel)
ToolFunction = TypeVar("ToolFunction", bound=Callable[..., Any])


def _reads(title: str) -> ToolAnnotations:
    return ToolAnnotations(title=title, read_only_hint=True, idempotent_hint=True, open_world_hint=False)


def _changes(title: str, *, idempotent: bool) -> ToolAnnotations:
    return ToolAnnotations(
        title=title, read_only_hint=False, destructive_hint=False, idempotent_hint=idempotent, open_world_hint=True
    )


def _description(function: Callable[..., Any]) -> str:
    # Models read this: no docstring indentation, and a wrapped line joined back into its sentence.
    return re.sub(r"(?<!\n)\n(?!\n)", " ", inspect.cleandoc(function.__doc__ or ""))


def _tool(server: MCPServer, name: str, annotations: ToolAnnotations) -> Callable[[ToolFunction], ToolFunction]:
    def register(function: ToolFunction) -> ToolFunction:
        server.add_tool(function, name=name, description=_description(function), annotations=annotations)
        return function

    return register


async def _answer(work: Awaitable[Result], render: Callable[[Result], str]) -> CallToolResult:
    """The tool's result (structured, and as text), or its failure as an error result the agent can read."""
    try:
        result = await work
    except ToolFailedError as failure:
        partial = failure.partial.model_dump(mode="json") if failure.partial is not None else None
        return CallToolResult(
            content=[TextContent(type="text", text=str(failure))], structured_content=partial, is_error=True
        )
    except (NodeUnreachableError, NodeApiError) as error:
        return CallToolResult(content=[TextContent(type="text", text=str(error))], is_error=True)
    return CallToolResult(
        content=[TextContent(type="text", text=render(result))], structured_content=result.model_dump(mode="json")
    )


def build_server(client: NodeClient) -> MCPServer:
    """The MCP server whose tools ask the node behind `client`."""
    server = MCPServer("exo", title="exo", version=version("exo"), instructions=INSTRUCTIONS, log_level="WARNING")

    @_tool(server, "exo_status", _reads("exo status"))
    async def exo_status() -> Annotated[CallToolResult, StatusResult]:
        """Is exo running and is its API usable? Returns the node id, version, number of peers and the models it
        serves with their state. An error result when exo is not running or refuses the API key."""
        return await _answer(status(client), StatusResult.describe)

    @_tool(server, "exo_cluster_info", _reads("exo cluster"))
    async def exo_cluster_info() -> Annotated[CallToolResult, ClusterInfo]:
        """The whole cluster: nodes up and down (with the master), memory free and total, every node's device,
        memory and cluster endpoints (the topology), and each model's instances with their shard assignments.
        Check the free memory here before running or fetching a large model."""
        return await _answer(cluster_info(client), describe_cluster)

    @_tool(server, "exo_list_nodes", _reads("exo nodes"))
    async def exo_list_nodes() -> Annotated[CallToolResult, ClusterNodeList]:
        """Every node the cluster has seen: id, name, address, device, memory, health (healthy, degraded or
        down, with the reason) and the models it serves."""
        return await _answer(list_nodes(client), describe_nodes)

    @_tool(server, "exo_node_health", _reads("exo node health"))
    async def exo_node_health(
        node_id: Annotated[str, Field(description="a node id or name (see exo_list_nodes)")],
    ) -> Annotated[CallToolResult, ClusterNode]:
        """One node's health (healthy, degraded or down, and why), when it was last seen, the shards it holds,
        its memory in use and its device. An error result names the known nodes when there is no such node."""
        return await _answer(node_health(client, node_id), describe_node_health)

    @_tool(server, "exo_shard_distribution", _reads("exo shard distribution"))
    async def exo_shard_distribution(
        model: Annotated[str, Field(description="a model id (see exo_list_models)")],
    ) -> Annotated[CallToolResult, ShardDistribution]:
        """Where a model runs: each instance's layers per node (rank, layer range) and the memory in use on those
        nodes. For a catalog model that is not running, whether it would fit the cluster's free memory."""
        return await _answer(shard_distribution(client, model), describe_shards)

    @_tool(server, "exo_performance_metrics", _reads("exo performance"))
    async def exo_performance_metrics(
        sample_seconds: Annotated[
            float, Field(ge=0.0, le=60.0, description="seconds to measure requests/s and tokens/s over (0: none)")
        ] = DEFAULT_SAMPLE_SECONDS,
    ) -> Annotated[CallToolResult, PerformanceMetrics]:
        """Per node and per model: requests served, failed and cancelled, tokens generated, time to first token,
        decode tokens/s, running tasks, queue depth and memory; plus requests/s and tokens/s measured over a short
        window."""
        return await _answer(performance_metrics(client, sample_seconds), describe_performance)

    @_tool(server, "exo_discover", _changes("Discover exo nodes", idempotent=True))
    async def exo_discover(
        wait_for_peers: Annotated[int, Field(ge=0, le=64, description="peers to wait for (0: do not wait)")] = 0,
        timeout: Annotated[float, Field(gt=0.0, le=120.0, description="seconds to wait for them")] = 10.0,
    ) -> Annotated[CallToolResult, Discovery]:
        """Changes the cluster: scans the local network for exo nodes (multicast) and connects to those found,
        then waits until `wait_for_peers` other nodes are up. Nodes on other networks need exo_add_peer."""
        return await _answer(discover(client, wait_for_peers, timeout), describe_discovery)

    @_tool(server, "exo_add_peer", _changes("Add an exo peer", idempotent=True))
    async def exo_add_peer(
        address: Annotated[str, Field(description="the peer's cluster endpoint, e.g. tcp/192.168.1.20:52414")],
    ) -> Annotated[CallToolResult, PeerConnection]:
        """Changes the cluster: connects this node to another exo node at its cluster endpoint, for networks
        where discovery does not reach it. Says whether that node joined this cluster."""
        return await _answer(add_peer(client, address), describe_peer)

    @_tool(server, "exo_list_models", _reads("exo models"))
    async def exo_list_models() -> Annotated[CallToolResult, ModelsResult]:
        """The models exo serves (id, state, where they load from, context length, tool-call format) and the
        catalog of models exo can fetch: family, size, download and disk size, the memory each needs to be served,
        and whether it is downloaded."""
        return await _answer(list_models(client), ModelsResult.describe)

    @_tool(server, "exo_download_model", _changes("Download a model into exo", idempotent=True))
    async def exo_download_model(
        model: Annotated[str, Field(description="a model id from exo's catalog (see exo_list_models)")],
        context: Context[Any, Any],
    ) -> Annotated[CallToolResult, DownloadDone]:
        """Changes the cluster: downloads a catalog model into the node's models directory and converts it for
        MLX (gigabytes of disk; minutes), sending progress notifications as it goes. Returns where it landed; an
        already downloaded model returns at once."""
        return await _answer(download_model(client, model, context.report_progress), describe_download)

    @_tool(server, "exo_place_model", _changes("Place a model over exo nodes", idempotent=True))
    async def exo_place_model(
        model: Annotated[str, Field(description="a model id or path the node asked can prepare (see exo_list_models)")],
        min_nodes: Annotated[int, Field(ge=1, description="split the model over at least this many nodes")] = 1,
        parallel: Annotated[
            ParallelChoice,
            Field(
                description="pipeline: by layers; tensor: by matrices, every node running every layer with a share "
                "of its heads; auto: the master's rule (the least estimated time per token from measured links)"
            ),
        ] = "auto",
    ) -> Annotated[CallToolResult, PlacedInstanceView]:
        """Changes the cluster: places a model over at least `min_nodes` nodes by their free memory (as POST
        /v1/cluster/instances does) and keeps it placed as nodes come and go; it loads in the background. Returns
        the instance: its split (`parallel`) and why (`parallel_reason`), and each rank's node and layers. Placing
        the same model again with the same choice returns the instance already placed. An error result names the
        nodes' free memory when it fits nowhere, or the head counts when a tensor split does not divide them."""
        return await _answer(place_model(client, model, min_nodes, parallel), describe_placement)

    @_tool(
        server,
        "exo_run_model",
        ToolAnnotations(
            title="Run a prompt on an exo model", read_only_hint=True, idempotent_hint=False, open_world_hint=False
        ),
    )
    async def exo_run_model(
        model: Annotated[str, Field(description="a model id that exo serves (see exo_list_models)")],
        prompt: Annotated[str, Field(description="the user message to send")],
        temperature: Annotated[float | None, Field(ge=0.0, le=2.0, description="sampling temperature")] = None,
        max_tokens: Annotated[int, Field(ge=1, le=32768, description="most tokens to generate")] = DEFAULT_MAX_TOKENS,
    ) -> Annotated[CallToolResult, RunResult]:
        """Run one prompt on a model through exo's chat-completions API and return the answer with its timing
        (tokens, seconds, tokens/s)."""
        return await _answer(run_model(client, model, prompt, temperature, max_tokens), RunResult.describe)

    return server
