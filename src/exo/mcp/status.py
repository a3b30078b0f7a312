"""exo_status: is exo up, is its API usable with our key, which node answers, its version, how many peers."""

from pydantic import Field

from exo.mcp.failures import ToolFailedError
from exo.mcp.node_client import NodeApiError, NodeClient, NodeUnreachableError
from exo.shared.types.cluster_api import ClusterModel
from exo.shared.types.common import FrozenModel


class StatusResult(FrozenModel):
    """Whether exo is up and usable, as seen from this MCP server."""

    url: str = Field(description="the node's API address")
    running: bool = Field(description="something answered at the address")
    api_reachable: bool = Field(description="the API answered a request made with this server's API key")
    node_id: str | None = Field(default=None, description="the node that answered")
    node_name: str | None = None
    version: str | None = Field(default=None, description="the node's exo version")
    cluster: str | None = Field(default=None, description="the cluster's name (--cluster)")
    master_node_id: str | None = None
    peers: int = Field(default=0, description="other nodes up in the cluster")
    models: list[ClusterModel] = Field(default_factory=list[ClusterModel], description="models and their instances")
    failures: list[str] = Field(default_factory=list[str], description="why a model's runner failed, if one did")

    def describe(self) -> str:
        """One paragraph for the agent to read."""
        if not self.running:
            return f"exo is not running at {self.url}."
        if not self.api_reachable:
            return f"exo is running at {self.url} but its API refused this server's API key."
        role = " (the master)" if self.master_node_id == self.node_id else ""
        lines = [
            f"exo {self.version} is up at {self.url}: node {self.node_name} [{self.node_id}]{role} in cluster "
            f"{self.cluster!r}, {self.peers} peer(s) up.",
        ]
        serving = [
            f"{model.model_id} ({', '.join(f'{one.status} on {one.node_name}' for one in model.instances)})"
            for model in self.models
        ]
        lines.append(f"Models: {'; '.join(serving) or 'none yet'}.")
        lines += [f"Failed: {failure}" for failure in self.failures]
        return "\n".join(lines)


async def status(client: NodeClient) -> StatusResult:
    """Ask the node; a node that is down or refuses our key is a failure that still carries what was learned."""
    down = StatusResult(url=client.base_url, running=False, api_reachable=False)
    try:
        await client.health()
    except NodeUnreachableError as error:
        raise ToolFailedError(str(error), partial=down) from error
    try:
        summary = await client.cluster()
    except NodeApiError as error:
        refused = down.model_copy(update={"running": True})
        raise ToolFailedError(str(error), partial=refused) from error
    node = await client.cluster_node(summary.node_id)
    state = await client.state()
    failures = [
        f"{runner.model_id} on {runner.node_id}: {runner.last_error}"
        for runner in state.runners.values()
        if runner.status == "failed" and runner.last_error
    ]
    return StatusResult(
        url=client.base_url,
        running=True,
        api_reachable=True,
        node_id=summary.node_id,
        node_name=node.display_name,
        version=node.exo_version,
        cluster=summary.cluster,
        master_node_id=summary.master_node_id,
        peers=max(summary.nodes_healthy + summary.nodes_degraded - 1, 0),
        models=summary.models,
        failures=failures,
    )
