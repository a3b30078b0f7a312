"""exo_list_models and exo_download_model: what exo serves, what it can fetch, and fetching it with progress."""

from collections.abc import Awaitable, Callable

from pydantic import Field
from rich.filesize import decimal

from exo.mcp.failures import ToolFailedError
from exo.mcp.memory import MemoryFit, memory_fit, require_fit
from exo.mcp.node_client import NodeApiError, NodeClient
from exo.models.catalog_api import DownloadDone, NodeCatalog
from exo.models.progress_display import describe_preparation
from exo.shared.types.common import FrozenModel, ModelId
from exo.shared.types.preparation import ModelPreparation
from exo.shared.types.runner_status import RunnerStatus

# A download reports its phases one after the other (fetching or assembling, then converting), each counting its
# own bytes from zero; MCP progress must grow with every notification, so each phase is one unit of a two-unit
# total and a snapshot that does not move it forward is not sent.
_PHASE_UNITS = {"downloading": 0.0, "assembling": 0.0, "converting": 1.0, "ready": 2.0}
DOWNLOAD_PROGRESS_TOTAL = 2.0

ProgressReporter = Callable[[float, float, str], Awaitable[None]]


class ServedModel(FrozenModel):
    model_id: ModelId
    status: RunnerStatus
    path: str = Field(description="where the node loads it from")
    context_length: int | None = None
    tool_format: str | None = Field(default=None, description="the tool-call format exo detected, if any")


class ModelsResult(FrozenModel):
    served: list[ServedModel]
    catalog: NodeCatalog = Field(description="the models exo can fetch, and which are downloaded on the node")
    fits: list[MemoryFit] = Field(description="each catalog model's memory need against the cluster's free memory")

    def describe(self) -> str:
        """One line per model."""
        lines = ["Served:" if self.served else "Served: none."]
        for model in self.served:
            tools = f", tool calls as {model.tool_format}" if model.tool_format else ""
            context = f", context {model.context_length}" if model.context_length else ""
            lines.append(f"- {model.model_id} ({model.status}{context}{tools}) from {model.path}")
        lines.append(f"Catalog (downloads go to {self.catalog.models_dir}):")
        fits = {fit.model_id: fit for fit in self.fits}
        for model in self.catalog.models:
            entry = model.listing.entry
            where = f"downloaded at {model.listing.path}" if model.listing.downloaded else "not downloaded"
            source = entry.source
            fetch = "comes with exo" if source.installed_with_exo else f"{decimal(source.download_bytes)} download"
            fit = fits[entry.model_id]
            memory = "fits the cluster's free memory" if fit.fits else "does NOT fit the cluster's free memory"
            lines.append(
                f"- {entry.model_id} ({entry.family} {entry.parameters}, {fetch}, {decimal(entry.disk_bytes)} on "
                f"disk, needs {decimal(model.memory_bytes)} of memory: {memory}): {where}"
            )
        if self.fits:
            lines.append(f"The cluster has {decimal(self.fits[0].available_bytes)} of memory free.")
        return "\n".join(lines)


async def list_models(client: NodeClient) -> ModelsResult:
    """Every model a runner serves or is loading, and the node's catalog."""
    state = await client.state()
    served = [
        ServedModel(
            model_id=runner.model_id,
            status=runner.status,
            path=runner.model_path,
            context_length=runner.described.context_length if runner.described else None,
            tool_format=runner.described.tool_format if runner.described else None,
        )
        for runner in sorted(state.runners.values(), key=lambda runner: runner.model_id)
    ]
    catalog = await client.catalog()
    cluster = await client.cluster()
    fits = [memory_fit(model, cluster) for model in catalog.models]
    return ModelsResult(served=served, catalog=catalog, fits=fits)


def describe_download(done: DownloadDone) -> str:
    """Where the model landed and how to serve it."""
    return f"{done.model_id} is downloaded at {done.path}. Serve it with `exo --model {done.model_id}`."


async def download_model(client: NodeClient, model: str, report: ProgressReporter) -> DownloadDone:
    """Have the node fetch and import `model`, passing its progress on as it goes."""
    reached: float | None = None

    async def forward(preparation: ModelPreparation) -> None:
        nonlocal reached
        phase_start = _PHASE_UNITS.get(preparation.phase)
        if phase_start is None:
            return  # a failure arrives as the download's error, not as progress
        fraction = preparation.done_bytes / preparation.total_bytes if preparation.total_bytes > 0 else 0.0
        units = min(phase_start + min(fraction, 1.0), DOWNLOAD_PROGRESS_TOTAL)
        if reached is not None and units <= reached:
            return  # MCP progress must grow with every notification
        reached = units
        await report(units, DOWNLOAD_PROGRESS_TOTAL, describe_preparation(preparation))

    catalog = await client.catalog()
    listed = next((entry for entry in catalog.models if entry.listing.entry.model_id == model), None)
    if listed is not None and not listed.listing.downloaded:
        require_fit(memory_fit(listed, await client.cluster()))
    try:
        return await client.download(model, forward)
    except NodeApiError as error:
        if error.code == "model_not_found":
            raise ToolFailedError(f"{error}. Call exo_list_models to see the catalog.") from error
        raise
