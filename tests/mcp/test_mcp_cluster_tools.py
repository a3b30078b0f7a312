"""exo's cluster tools through the official `mcp` SDK client against a real two-node cluster: `alpha` serves the tiny
tool-calling fixture model, `beta` lends its memory (`--no-model`) and joined through `--peer`. A third node,
`gamma`, starts alone and is brought in by exo_add_peer (the last test, since it changes the cluster).

Every read tool runs over stdio and over `/mcp`; each answer is checked against the cluster API's own view, and
each failure (an unknown node or model, an unreachable peer, too few peers) must be an error result that says what
is wrong, after which the server keeps answering.
"""

import time
from collections.abc import Iterator
from uuid import uuid4

import anyio
import pytest
from mcp_types import CallToolResult
from rich.filesize import decimal

from exo.mcp.cluster import ClusterInfo, ShardDistribution
from exo.mcp.inference import RunResult
from exo.mcp.metrics import PerformanceMetrics
from exo.mcp.peers import Discovery
from exo.models.catalog import CATALOG
from exo.shared.local_backend import local_weights_in_memory
from exo.shared.types.cluster_api import ClusterNode, ClusterNodeList, ClusterSummary, PeerConnection
from tests.cluster.local_cluster import ClusterNode as LocalNode
from tests.cluster.local_cluster import LocalCluster, local_cluster
from tests.exo_server import fixture_model, free_port
from tests.mcp.mcp_clients import TRANSPORTS, McpTransport, exo_mcp_client, text_of

MODEL = "tiny-qwen-tools"
WINDOW_SECONDS = 40
both_transports = pytest.mark.parametrize("transport", TRANSPORTS)


class Cluster:
    def __init__(self, running: LocalCluster, alpha: LocalNode, beta: LocalNode, gamma: LocalNode) -> None:
        self.running = running
        self.alpha = alpha
        self.beta = beta
        self.gamma = gamma

    def summary(self) -> ClusterSummary:
        return ClusterSummary.model_validate(self.alpha.get("/v1/cluster"))

    def nodes(self) -> list[ClusterNode]:
        return ClusterNodeList.model_validate(self.alpha.get("/v1/cluster/nodes")).data


def _healthy(node: LocalNode, count: int) -> bool:
    return ClusterSummary.model_validate(node.get("/v1/cluster")).nodes_healthy == count


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    work = tmp_path_factory.mktemp("exo-mcp-cluster")
    with local_cluster(work, f"mcp-{uuid4().hex[:8]}") as running:
        alpha = running.start("alpha", [fixture_model(MODEL)])
        beta = running.start("beta", peers=[alpha])
        gamma = running.start("gamma")
        running.wait_until(alpha, lambda: _healthy(alpha, 2), "beta to join", 60)
        yield Cluster(running, alpha, beta, gamma)


@both_transports
async def test_the_cluster_tools_are_listed_and_the_changing_ones_say_so(
    transport: McpTransport, cluster: Cluster
) -> None:
    async with exo_mcp_client(transport, cluster.alpha.base_url, None) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    reads = {"exo_cluster_info", "exo_list_nodes", "exo_node_health", "exo_shard_distribution"}
    reads.add("exo_performance_metrics")
    changes = {"exo_discover", "exo_add_peer"}
    assert set(tools) >= reads | changes
    for name in reads:
        annotations = tools[name].annotations
        assert annotations is not None, name
        assert annotations.read_only_hint is True, name
    for name in changes:
        annotations = tools[name].annotations
        assert annotations is not None, name
        assert annotations.read_only_hint is False, name
        assert (tools[name].description or "").startswith("Changes the cluster:"), name
    assert tools["exo_node_health"].input_schema["required"] == ["node_id"]
    assert tools["exo_shard_distribution"].input_schema["required"] == ["model"]
    assert tools["exo_add_peer"].input_schema["required"] == ["address"]


@both_transports
async def test_cluster_info_shows_both_nodes_the_memory_and_where_the_model_runs(
    transport: McpTransport, cluster: Cluster
) -> None:
    async with exo_mcp_client(transport, cluster.alpha.base_url, None) as client:
        result = await client.call_tool("exo_cluster_info", {})
    assert not result.is_error, result
    info = ClusterInfo.model_validate(result.structured_content)
    summary = info.summary
    assert (summary.node_id, summary.master_node_id) == (cluster.alpha.node_id, cluster.alpha.node_id)
    assert (summary.nodes_healthy, summary.nodes_degraded, summary.nodes_down) == (2, 0, 0)
    assert {node.name: node.node_id for node in info.nodes} == {
        "alpha": cluster.alpha.node_id,
        "beta": cluster.beta.node_id,
    }
    assert summary.memory_total_bytes == sum(node.memory_total_bytes for node in info.nodes)
    assert summary.memory_total_bytes > 0
    (model,) = summary.models
    (instance,) = model.instances
    assert (model.model_id, instance.node_name, instance.status, instance.rank) == (MODEL, "alpha", "ready", 0)
    text = text_of(result)
    assert f"Cluster {summary.cluster!r}: 2 node(s) up (2 healthy, 0 degraded), 0 down" in text
    assert f"master {cluster.alpha.node_id}." in text
    assert f"- alpha [{cluster.alpha.node_id}] (this node, master, healthy): " in text
    assert f"- beta [{cluster.beta.node_id}] (healthy): " in text
    assert f"serves {MODEL}; reach it at {cluster.alpha.endpoint}" in text
    assert f"- {MODEL}: instance {instance.instance_id} rank 0/1 on alpha, layers 0-" in text


@both_transports
async def test_list_nodes_and_node_health_by_id_or_name(transport: McpTransport, cluster: Cluster) -> None:
    async with exo_mcp_client(transport, cluster.beta.base_url, None) as client:
        listed = await client.call_tool("exo_list_nodes", {})
        by_name = await client.call_tool("exo_node_health", {"node_id": "alpha"})
        by_id = await client.call_tool("exo_node_health", {"node_id": cluster.beta.node_id})
    assert not listed.is_error, listed
    nodes = ClusterNodeList.model_validate(listed.structured_content).data
    assert [(node.name, node.status) for node in nodes] == [("alpha", "healthy"), ("beta", "healthy")]
    assert text_of(listed).startswith(f"Nodes:\n- alpha [{cluster.alpha.node_id}] (master, healthy): ")

    alpha = ClusterNode.model_validate(by_name.structured_content)
    assert (alpha.node_id, alpha.is_master, alpha.status) == (cluster.alpha.node_id, True, "healthy")
    assert [model.model_id for model in alpha.models] == [MODEL]
    text = text_of(by_name)
    assert text.startswith(f"alpha [{cluster.alpha.node_id}] is healthy; last seen ")
    assert "s ago; it is the master." in text
    assert f"Cluster endpoints: {cluster.alpha.endpoint}; API port {cluster.alpha.api_port}." in text
    assert f"Shards held:\n- {MODEL}: rank 0/1, layers 0-" in text

    beta = ClusterNode.model_validate(by_id.structured_content)
    assert (beta.name, beta.serves_models, beta.models) == ("beta", False, [])
    assert "Shards held: none." in text_of(by_id)
    assert f"memory {decimal(beta.memory_available_bytes)} free of {decimal(beta.memory_total_bytes)}" in (
        text_of(by_id)
    )


async def test_an_unknown_node_is_an_error_result_naming_the_known_ones(cluster: Cluster) -> None:
    async with exo_mcp_client("http", cluster.alpha.base_url, None) as client:
        unknown = await client.call_tool("exo_node_health", {"node_id": "delta"})
        after = await client.call_tool("exo_list_nodes", {})
    assert unknown.is_error
    assert text_of(unknown) == (
        f"no node 'delta' in this cluster (nodes: alpha [{cluster.alpha.node_id}], beta [{cluster.beta.node_id}]); "
        "exo_list_nodes lists them"
    )
    assert not after.is_error


@both_transports
async def test_shard_distribution_of_a_running_model_an_idle_one_and_an_unknown_one(
    transport: McpTransport, cluster: Cluster
) -> None:
    idle = CATALOG[1]
    async with exo_mcp_client(transport, cluster.alpha.base_url, None) as client:
        running = await client.call_tool("exo_shard_distribution", {"model": MODEL})
        not_running = await client.call_tool("exo_shard_distribution", {"model": idle.model_id})
        unknown = await client.call_tool("exo_shard_distribution", {"model": "gpt-5"})
    assert not running.is_error, running
    distribution = ShardDistribution.model_validate(running.structured_content)
    (instance,) = distribution.instances
    assert (instance.node_id, instance.start_layer, instance.rank, instance.world_size) == (
        cluster.alpha.node_id,
        0,
        0,
        1,
    )
    assert [node.name for node in distribution.nodes] == ["alpha"]
    assert text_of(running).startswith(f"{MODEL}:\n- instance {instance.instance_id}, rank 0/1 on alpha: layers 0-")
    assert "; node memory " in text_of(running)

    assert not not_running.is_error, not_running
    fit = ShardDistribution.model_validate(not_running.structured_content).fit
    assert fit is not None
    summary = cluster.summary()
    needed = idle.memory_bytes(local_weights_in_memory())
    assert (fit.needed_bytes, fit.total_bytes, fit.nodes_up) == (needed, summary.memory_total_bytes, 2)
    assert fit.fits == (fit.needed_bytes <= fit.available_bytes)
    assert text_of(not_running).startswith(
        f"{idle.model_id} is not running on any node. {idle.model_id} needs {decimal(needed)} of memory "
        "to serve; the cluster has "
    )

    assert unknown.is_error
    assert text_of(unknown) == (
        f"'gpt-5' is neither running (running: {MODEL}) nor in exo's catalog; exo_list_models lists both"
    )


@both_transports
async def test_discover_finds_the_peer_that_is_up_and_a_silent_peer_is_an_error_result(
    transport: McpTransport, cluster: Cluster
) -> None:
    unreachable = f"tcp/127.0.0.1:{free_port()}"
    async with exo_mcp_client(transport, cluster.beta.base_url, None) as client:
        found = await client.call_tool("exo_discover", {"wait_for_peers": 1, "timeout": 30})
        refused = await client.call_tool("exo_add_peer", {"address": unreachable})
        after = await client.call_tool("exo_list_nodes", {})
    assert not found.is_error, found
    discovery = Discovery.model_validate(found.structured_content)
    assert (discovery.peers_up, discovery.wanted_peers) == (1, 1)  # alpha; gamma has not joined yet
    assert text_of(found).endswith(f"1 peer(s) up after {discovery.waited_seconds:.1f} s.")
    assert refused.is_error
    assert unreachable in text_of(refused)
    assert text_of(refused).endswith("listening on that cluster port (52414 unless --listen says otherwise)?")
    assert not after.is_error


async def test_performance_metrics_count_a_request_made_during_the_window(cluster: Cluster) -> None:
    url = cluster.alpha.base_url
    before = PerformanceMetrics.model_validate(
        (await _call(url, "exo_performance_metrics", {"sample_seconds": 0})).structured_content
    )
    finished_before = {model.model_id: model.requests_finished for model in before.metrics.models}.get(MODEL, 0)
    answers: dict[str, CallToolResult] = {}

    async def measure() -> None:
        answers["window"] = await _call(url, "exo_performance_metrics", {"sample_seconds": WINDOW_SECONDS})

    # The request starts well after the window's first reading and ends well before its last (a tiny-model
    # completion takes about a second; the margins are for a loaded 2-core machine).
    async with anyio.create_task_group() as group:
        group.start_soon(measure)
        await anyio.sleep(8)
        answers["run"] = await _call(url, "exo_run_model", {"model": MODEL, "prompt": "Hello!", "temperature": 0})
    run = answers["run"]
    assert not run.is_error, run
    generated = RunResult.model_validate(run.structured_content).completion_tokens

    result = answers["window"]
    assert not result.is_error, result
    performance = PerformanceMetrics.model_validate(result.structured_content)
    (model,) = performance.metrics.models
    assert (model.model_id, model.node_ids, model.requests_finished) == (
        MODEL,
        [cluster.alpha.node_id],
        finished_before + 1,
    )
    assert model.decode_tokens_per_second is not None
    assert model.decode_tokens_per_second > 0
    (rate,) = performance.model_rates
    seconds = performance.sample_seconds
    assert seconds >= WINDOW_SECONDS
    # The rates divide by the exact window; sample_seconds shows it rounded to 0.01 s, so allow a rounding step.
    assert rate.requests_per_second == pytest.approx(1 / seconds, abs=0.001)
    assert rate.generated_tokens_per_second == pytest.approx(generated / seconds, abs=0.01)
    beta = next(node for node in performance.metrics.nodes if node.name == "beta")
    assert (beta.requests_finished, beta.memory_total_bytes > 0) == (0, True)
    text = text_of(result)
    assert f"- {MODEL}: {model.requests_finished} requests (0 failed, 0 cancelled)" in text
    assert f"over the last {seconds:g} s: {rate.requests_per_second:g} requests/s" in text


async def _call(url: str, name: str, arguments: dict[str, object]) -> CallToolResult:
    async with exo_mcp_client("http", url, None) as client:
        return await client.call_tool(name, arguments)


async def test_adding_a_peer_brings_a_node_in_and_discover_waits_for_it(cluster: Cluster) -> None:
    unreachable = f"tcp/127.0.0.1:{free_port()}"
    async with exo_mcp_client("stdio", cluster.alpha.base_url, None) as client:
        refused = await client.call_tool("exo_add_peer", {"address": unreachable})
        malformed = await client.call_tool("exo_add_peer", {"address": "not an endpoint"})
        too_few = await client.call_tool("exo_discover", {"wait_for_peers": 2, "timeout": 1})
        added = await client.call_tool("exo_add_peer", {"address": cluster.gamma.endpoint})
        started = time.monotonic()
        waited = await client.call_tool("exo_discover", {"wait_for_peers": 2, "timeout": 60})
        waited_seconds = time.monotonic() - started
    assert refused.is_error
    assert unreachable in text_of(refused)
    assert text_of(refused).endswith(
        "Is an exo node running there, listening on that cluster port (52414 unless --listen says otherwise)?"
    )
    assert malformed.is_error
    assert text_of(malformed) == (
        "'not an endpoint' is not a cluster endpoint: expected tcp/HOST:PORT (e.g. tcp/10.0.0.2:52414)"
    )

    assert too_few.is_error
    assert text_of(too_few) == (
        "only 1 of the 2 peer(s) wanted were up after 1 s. Nodes on other networks need exo_add_peer with their "
        "address."
    )
    assert Discovery.model_validate(too_few.structured_content).peers_up == 1

    assert not added.is_error, added
    connection = PeerConnection.model_validate(added.structured_content)
    assert (connection.node_id, connection.joined) == (cluster.gamma.node_id, True)
    assert text_of(added) == f"Connected to {cluster.gamma.endpoint}: node {cluster.gamma.node_id} is in the cluster."

    assert not waited.is_error, waited
    discovery = Discovery.model_validate(waited.structured_content)
    assert (discovery.peers_up, discovery.wanted_peers) == (2, 2)
    assert discovery.waited_seconds <= waited_seconds
    assert text_of(waited).endswith(f"2 peer(s) up after {discovery.waited_seconds:.1f} s.")
    assert {node.name for node in cluster.nodes() if node.status == "healthy"} == {"alpha", "beta", "gamma"}
