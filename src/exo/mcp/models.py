"""exo_list_models: the models exo serves (with their runners' state)."""

from pydantic import Field

from exo.mcp.node_client import NodeClient
from exo.shared.types.common import FrozenModel, ModelId
from exo.shared.types.worker.runner_status import RunnerStatus


class ServedModel(FrozenModel):
    model_id: ModelId
    status: RunnerStatus
    path: str = Field(description="where the node loads it from")
    context_length: int | None = None
    tool_format: str | None = Field(default=None, description="the tool-call format exo detected, if any")


class ModelsResult(FrozenModel):
    served: list[ServedModel]

    def describe(self) -> str:
        """One line per model."""
        if not self.served:
            return "exo serves no model."
        lines = ["Served:"]
        for model in self.served:
            tools = f", tool calls as {model.tool_format}" if model.tool_format else ""
            context = f", context {model.context_length}" if model.context_length else ""
            lines.append(f"- {model.model_id} ({model.status}{context}{tools}) from {model.path}")
        return "\n".join(lines)


async def list_models(client: NodeClient) -> ModelsResult:
    """Every model a runner serves or is loading, from the node's state."""
    state = await client.state()
    served = [
        ServedModel(
            model_id=runner.model_id,
            status=runner.status,
            path=runner.model_path,
            context_length=runner.metadata.context_length if runner.metadata else None,
            tool_format=runner.metadata.tool_format if runner.metadata else None,
        )
        for runner in sorted(state.runners.values(), key=lambda runner: runner.model_id)
    ]
    return ModelsResult(served=served)
