"""The cluster read tools: exo_cluster_info, exo_list_nodes, exo_node_health, exo_shard_distribution.

Each returns the cluster API's own typed documents (or a small wrapper of them) and renders them as text an agent
reads at a glance: which nodes are up, how much memory is free, which model runs where.
"""

import time

from pydantic import Field
from rich.filesize import decimal

from exo.mcp.failures import ToolFailedError
from exo.mcp.memory import MemoryFit, memory_fit
from exo.mcp.node_client import NodeApiError, NodeClient
from exo.shared.types.cluster_api import ClusterModel, ClusterNode, ClusterNodeList, ClusterSummary, ModelInstance
from exo.shared.types.common import FrozenModel


class ClusterInfo(FrozenModel):
    """The cluster at a glance and every node's facts."""

    summary: ClusterSummary
    nodes: list[ClusterNode]


class ShardDistribution(FrozenModel):
    """Where a model's layers run, and the memory in use on those nodes; or, for a model not running, whether it
    would fit."""

    model_id: str
    instances: list[ModelInstance]
    nodes: list[ClusterNode] = Field(description="the nodes holding a shard")
    fit: MemoryFit | None = Field(default=None, description="for a catalog model that is not running")


def _layers(instance: ModelInstance) -> str:
    end = "last" if instance.end_layer is None else str(instance.end_layer - 1)
    return f"layers {instance.start_layer}-{end}"


def _memory(node: ClusterNode) -> str:
    used = node.memory_total_bytes - node.memory_available_bytes
    return f"{decimal(node.memory_available_bytes)} free of {decimal(node.memory_total_bytes)} ({decimal(used)} in use)"


def _node_line(node: ClusterNode, answering: str | None = None) -> str:
    roles = [role for role, on in (("this node", node.node_id == answering), ("master", node.is_master)) if on]
    state = node.status + (f": {node.reason}" if node.reason else "")
    serves = ", ".join(model.model_id for model in node.models) or "no model"
    return (
        f"- {node.display_name} [{node.node_id}] ({', '.join([*roles, state])}): {node.device}, "
        f"mlx {node.mlx_backend}, "
        f"{_memory(node)}; serves {serves}; reach it at {', '.join(node.cluster_endpoints) or 'no endpoint'}"
    )


def _model_lines(models: list[ClusterModel]) -> list[str]:
    lines: list[str] = []
    for model in models:
        for instance in model.instances:
            lines.append(
                f"- {model.model_id}: instance {instance.instance_id} rank {instance.rank}/{instance.world_size} "
                f"on {instance.node_name}, {_layers(instance)}, {instance.status}"
            )
    return lines or ["- none"]


def describe_cluster(info: ClusterInfo) -> str:
    """Nodes, memory, models and where they run."""
    summary = info.summary
    up = summary.nodes_healthy + summary.nodes_degraded
    lines = [
        f"Cluster {summary.cluster!r}: {up} node(s) up ({summary.nodes_healthy} healthy, {summary.nodes_degraded} "
        f"degraded), {summary.nodes_down} down; master {summary.master_node_id or 'not elected yet'}.",
        f"Memory: {decimal(summary.memory_available_bytes)} free of {decimal(summary.memory_total_bytes)} "
        "across the nodes that are up.",
        "Nodes:",
        *(_node_line(node, summary.node_id) for node in info.nodes),
        "Models (instances and their shards):",
        *_model_lines(summary.models),
    ]
    return "\n".join(lines)


def describe_nodes(nodes: ClusterNodeList) -> str:
    """One line per node."""
    return "\n".join(["Nodes:", *(_node_line(node) for node in nodes.data)]) if nodes.data else "No nodes."


def describe_node_health(node: ClusterNode) -> str:
    """The node's health, when it was last seen, its shards and its resource use."""
    seen = max(time.time() - node.last_seen, 0.0)
    reason = f" ({node.reason})" if node.reason else ""
    shards = [
        f"- {model.model_id}: rank {instance.rank}/{instance.world_size}, {_layers(instance)}, {instance.status}"
        for model in node.models
        for instance in model.instances
    ]
    return "\n".join(
        [
            f"{node.display_name} [{node.node_id}] is {node.status}{reason}; last seen {seen:.0f} s ago"
            + ("; it is the master." if node.is_master else "."),
            f"{node.platform}, {node.device}, mlx {node.mlx_backend}, exo {node.exo_version}; memory {_memory(node)}.",
            f"Cluster endpoints: {', '.join(node.cluster_endpoints) or 'none'}; API port {node.api_port}.",
            "Shards held:" if shards else "Shards held: none.",
            *shards,
            *([f"Preparing: {', '.join(node.preparing)}."] if node.preparing else []),
        ]
    )


def describe_shards(distribution: ShardDistribution) -> str:
    """Layers per node and the memory in use there; or whether a model that is not running would fit."""
    if not distribution.instances:
        fit = distribution.fit
        verdict = "" if fit is None else f" {fit.describe()}: it {'fits' if fit.fits else 'does not fit'}."
        return f"{distribution.model_id} is not running on any node.{verdict}"
    nodes = {node.node_id: node for node in distribution.nodes}
    lines = [f"{distribution.model_id}:"]
    for instance in distribution.instances:
        node = nodes.get(instance.node_id)
        memory = f"; node memory {_memory(node)}" if node is not None else ""
        lines.append(
            f"- instance {instance.instance_id}, rank {instance.rank}/{instance.world_size} on {instance.node_name}: "
            f"{_layers(instance)}, {instance.status}{memory}"
        )
    return "\n".join(lines)


async def cluster_info(client: NodeClient) -> ClusterInfo:
    """GET /v1/cluster and /v1/cluster/nodes."""
    return ClusterInfo(summary=await client.cluster(), nodes=(await client.cluster_nodes()).data)


async def list_nodes(client: NodeClient) -> ClusterNodeList:
    """GET /v1/cluster/nodes."""
    return await client.cluster_nodes()


async def node_health(client: NodeClient, node: str) -> ClusterNode:
    """One node by id, or by name when no id matches; an unknown node is a failure that lists the known ones."""
    try:
        return await client.cluster_node(node)
    except NodeApiError as error:
        if error.status_code != 404:
            raise
    nodes = (await client.cluster_nodes()).data
    named = [candidate for candidate in nodes if node in (candidate.display_name, candidate.name)]
    if len(named) == 1:
        return named[0]
    known = ", ".join(f"{candidate.display_name} [{candidate.node_id}]" for candidate in nodes) or "none"
    raise ToolFailedError(f"no node {node!r} in this cluster (nodes: {known}); exo_list_nodes lists them")


async def shard_distribution(client: NodeClient, model: str) -> ShardDistribution:
    """Where `model`'s shards run; a model that runs nowhere is answered with whether it would fit."""
    summary = await client.cluster()
    served = next((served for served in summary.models if served.model_id == model), None)
    if served is not None:
        node_ids = {instance.node_id for instance in served.instances}
        nodes = [node for node in (await client.cluster_nodes()).data if node.node_id in node_ids]
        return ShardDistribution(model_id=model, instances=served.instances, nodes=nodes)
    catalog = await client.catalog()
    listed = next((entry for entry in catalog.models if entry.listing.entry.model_id == model), None)
    if listed is None:
        running = ", ".join(served.model_id for served in summary.models) or "none"
        raise ToolFailedError(
            f"{model!r} is neither running (running: {running}) nor in exo's catalog; exo_list_models lists both"
        )
    return ShardDistribution(model_id=model, instances=[], nodes=[], fit=memory_fit(listed, summary))
