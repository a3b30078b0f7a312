"""exo_status: is exo up, is its API usable with our key, which node answers, how many peers, which models."""

from pydantic import Field

from exo.mcp.failures import ToolFailedError
from exo.mcp.node_client import NodeApiError, NodeClient, NodeUnreachableError
from exo.shared.types.common import FrozenModel, ModelId, NodeId
from exo.shared.types.worker.runner_status import RunnerStatus


class ModelStatus(FrozenModel):
    model_id: ModelId
    status: RunnerStatus
    last_error: str | None = None


class StatusResult(FrozenModel):
    """Whether exo is up and usable, as seen from this MCP server."""

    url: str = Field(description="the node's API address")
    running: bool = Field(description="something answered at the address")
    api_reachable: bool = Field(description="the API answered a request made with this server's API key")
    node_id: NodeId | None = None
    version: str | None = Field(default=None, description="the node's exo version")
    peers: int = Field(default=0, description="other nodes in the cluster")
    models: list[ModelStatus] = Field(default_factory=list[ModelStatus], description="models and their runners")

    def describe(self) -> str:
        """One paragraph for the agent to read."""
        if not self.running:
            return f"exo is not running at {self.url}."
        if not self.api_reachable:
            return f"exo is running at {self.url} but its API refused this server's API key."
        ready = [model.model_id for model in self.models if model.status in ("ready", "running")]
        others = [f"{model.model_id} ({model.status})" for model in self.models if model.model_id not in ready]
        version = f" version {self.version}," if self.version else ""
        lines = [
            f"exo is up at {self.url}: node {self.node_id},{version} {self.peers} peer(s).",
            f"Serving: {', '.join(ready) or 'no model yet'}.",
        ]
        if others:
            lines.append(f"Not ready: {', '.join(others)}.")
        return "\n".join(lines)


async def status(client: NodeClient) -> StatusResult:
    """Ask the node; a node that is down or refuses our key is a failure that still carries what was learned."""
    down = StatusResult(url=client.base_url, running=False, api_reachable=False)
    try:
        await client.health()
    except NodeUnreachableError as error:
        raise ToolFailedError(str(error), partial=down) from error
    try:
        state = await client.state()
    except NodeApiError as error:
        refused = down.model_copy(update={"running": True})
        raise ToolFailedError(str(error), partial=refused) from error
    node_ids = sorted(state.nodes)
    return StatusResult(
        url=client.base_url,
        running=True,
        api_reachable=True,
        node_id=node_ids[0] if node_ids else None,
        peers=max(len(node_ids) - 1, 0),
        models=[
            ModelStatus(model_id=runner.model_id, status=runner.status, last_error=runner.last_error)
            for runner in sorted(state.runners.values(), key=lambda runner: runner.model_id)
        ],
    )
