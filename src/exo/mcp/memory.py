"""Does a model fit the cluster's free memory? The check every tool makes before running or fetching a model."""

from rich.filesize import decimal

from exo.mcp.failures import ToolFailedError
from exo.models.catalog_api import NodeCatalogModel
from exo.shared.types.cluster_api import ClusterSummary
from exo.shared.types.common import FrozenModel


class MemoryFit(FrozenModel):
    """A model's memory need against what the cluster has free right now."""

    model_id: str
    needed_bytes: int
    available_bytes: int
    total_bytes: int
    nodes_up: int
    fits: bool

    def describe(self) -> str:
        """`needs 6.2 GB of memory to serve; the cluster has 3.1 GB free (of 24.0 GB on 1 node)`."""
        nodes = f"{self.nodes_up} node" + ("" if self.nodes_up == 1 else "s")
        return (
            f"{self.model_id} needs {decimal(self.needed_bytes)} of memory to serve; the cluster has "
            f"{decimal(self.available_bytes)} free (of {decimal(self.total_bytes)} on {nodes})"
        )


def memory_fit(model: NodeCatalogModel, cluster: ClusterSummary) -> MemoryFit:
    """How `model` compares with the cluster's free memory."""
    return MemoryFit(
        model_id=model.listing.entry.model_id,
        needed_bytes=model.memory_bytes,
        available_bytes=cluster.memory_available_bytes,
        total_bytes=cluster.memory_total_bytes,
        nodes_up=cluster.nodes_healthy + cluster.nodes_degraded,
        fits=model.memory_bytes <= cluster.memory_available_bytes,
    )


def require_fit(fit: MemoryFit) -> None:
    """Raise the agent-readable failure when the model does not fit, naming the numbers and the ways out."""
    if not fit.fits:
        raise ToolFailedError(
            f"{fit.describe()}: it is too large for the cluster's memory. Add a node with more memory "
            "(exo_add_peer, exo_discover) or pick a smaller model (exo_list_models).",
            partial=fit,
        )
