"""What the node's model-catalog endpoints answer: the catalog as found on that node, and a download's events."""

from typing import Annotated, Literal

from pydantic import Field

from exo.models.catalog import CatalogListing, catalog_held_as
from exo.shared.types.api import ErrorBody
from exo.shared.types.common import FrozenModel, ModelId
from exo.shared.types.footprint import WeightsInMemory
from exo.shared.types.preparation import ModelPreparation


class NodeCatalogModel(FrozenModel):
    """A catalog entry on this node: whether it is downloaded, and the memory it needs to be served here."""

    listing: CatalogListing
    # How this node's runners hold this model's weights: per `--cpu-weights` on a Linux CPU under `--cpu-kernels
    # auto` (`auto` resolved: a catalog import keeps its GGUF), else as stored (a catalog import is float16).
    weights_in_memory: WeightsInMemory
    # The weights' memory held that way (`CatalogEntry.memory_bytes`); serving needs room beyond it for the KV cache.
    memory_bytes: int

    @classmethod
    def of(cls, listing: CatalogListing, weights: WeightsInMemory) -> "NodeCatalogModel":
        held = catalog_held_as(weights)
        return cls(listing=listing, weights_in_memory=held, memory_bytes=listing.entry.memory_bytes(held))


class NodeCatalog(FrozenModel):
    """GET /v1/catalog."""

    models_dir: str
    models: list[NodeCatalogModel]


class DownloadRequest(FrozenModel):
    """POST /v1/catalog/download: fetch and import a catalog model into this node's models directory."""

    model: str


class DownloadProgress(FrozenModel):
    type: Literal["progress"] = "progress"
    preparation: ModelPreparation


class DownloadDone(FrozenModel):
    type: Literal["done"] = "done"
    model_id: ModelId
    path: str


class DownloadFailed(FrozenModel):
    type: Literal["error"] = "error"
    error: ErrorBody


DownloadEvent = Annotated[DownloadProgress | DownloadDone | DownloadFailed, Field(discriminator="type")]
"""One server-sent event of a download: progress snapshots, then `done` or `error`."""
