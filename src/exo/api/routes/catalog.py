"""The model catalog on this node: GET /v1/catalog (what exo can fetch, what is downloaded here) and
POST /v1/catalog/download (fetch and import one model, streaming its progress as server-sent events).

A download runs in a worker thread (the fetch and conversion block); its progress goes both to the response and to
/state, like the progress of a model named at start-up. One download per model at a time: a second request for the
same model waits for the first, then finds the model there.
"""

import math
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
from anyio.streams.memory import MemoryObjectSendStream
from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from exo.api.errors import ApiError
from exo.models.catalog import CATALOG, CatalogListing, catalog_listing, find_entry
from exo.models.catalog_api import (
    DownloadDone,
    DownloadEvent,
    DownloadFailed,
    DownloadProgress,
    DownloadRequest,
    NodeCatalog,
    NodeCatalogModel,
)
from exo.models.catalog_fetch import ensure_catalog_model
from exo.models.progress import PreparationSink, PreparationTracker
from exo.shared.errors import ExoModelError
from exo.shared.types.api import ErrorBody, ErrorResponse
from exo.shared.types.common import ModelId
from exo.shared.types.footprint import WeightsInMemory
from exo.shared.types.preparation import ModelPreparation

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorResponse, "description": "Missing or wrong API key"},
    404: {"model": ErrorResponse, "description": "Model not in the catalog"},
}


def catalog_router(
    models_dir: Path,
    record_preparation: PreparationSink | None,
    hide_paths: Callable[[str], str],
    weights: WeightsInMemory,
) -> APIRouter:
    """This node's catalog routes, downloading into `models_dir` (progress also to `record_preparation`); paths in
    answers go through `hide_paths` (labels instead of this node's directories, unless --show-model-paths); memory is
    for weights held as `weights` (the node's `weights_in_memory`)."""
    router = APIRouter(tags=["Model catalog"])
    locks: dict[ModelId, anyio.Lock] = {}

    @router.get("/v1/catalog", responses=_ERRORS)
    async def catalog() -> NodeCatalog:
        listings = catalog_listing(models_dir)
        models = [NodeCatalogModel.of(_hidden_listing(listing, hide_paths), weights) for listing in listings]
        return NodeCatalog(models_dir=hide_paths(str(models_dir)), models=models)

    @router.post("/v1/catalog/download", response_class=StreamingResponse, responses=_ERRORS)
    async def download(request: DownloadRequest) -> StreamingResponse:
        entry = find_entry(request.model)
        if entry is None:
            known = ", ".join(listed.model_id for listed in CATALOG)
            raise ApiError(
                404,
                f"'{request.model}' is not in exo's model catalog (it lists: {known})",
                error_type="not_found_error",
                param="model",
                code="model_not_found",
            )
        lock = locks.setdefault(entry.model_id, anyio.Lock())
        events = _download_events(record_preparation, entry.model_id, models_dir, lock, hide_paths)
        return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    return router


def _hidden_listing(listing: CatalogListing, hide_paths: Callable[[str], str]) -> CatalogListing:
    if listing.path is None:
        return listing
    return listing.model_copy(update={"path": Path(hide_paths(str(listing.path)))})


async def _download_events(
    record_preparation: PreparationSink | None,
    model_id: ModelId,
    models_dir: Path,
    lock: anyio.Lock,
    hide_paths: Callable[[str], str],
) -> AsyncIterator[str]:
    sender, receiver = anyio.create_memory_object_stream[DownloadEvent](math.inf)
    async with anyio.create_task_group() as group:
        group.start_soon(_download, record_preparation, model_id, models_dir, lock, sender)
        async with receiver:
            async for event in receiver:
                yield f"data: {hide_paths(event.model_dump_json())}\n\n"


async def _download(
    record_preparation: PreparationSink | None,
    model_id: ModelId,
    models_dir: Path,
    lock: anyio.Lock,
    sender: MemoryObjectSendStream[DownloadEvent],
) -> None:
    def publish(preparation: ModelPreparation) -> None:
        # Called from the download thread: the node records it as its own preparation, the client sees it.
        if record_preparation is not None:
            record_preparation(preparation)
        anyio.from_thread.run_sync(sender.send_nowait, DownloadProgress(preparation=preparation))

    async with sender, lock:
        entry = find_entry(model_id)
        assert entry is not None
        tracker = PreparationTracker(model_id, (publish,))
        try:
            path = await anyio.to_thread.run_sync(ensure_catalog_model, entry, models_dir, tracker)
        except ExoModelError as error:
            if tracker.last is not None:
                await anyio.to_thread.run_sync(tracker.fail, str(error))
            body = ErrorBody(message=str(error), type="server_error", code="download_failed")
            await sender.send(DownloadFailed(error=body))
            return
        if tracker.last is not None:
            await anyio.to_thread.run_sync(tracker.finish)
        await sender.send(DownloadDone(model_id=model_id, path=str(path)))
