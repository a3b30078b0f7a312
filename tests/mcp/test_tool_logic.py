"""The tools' own logic against a scripted node: download progress that only grows across phases, failures the
node reports mid-download, replies in a shape the client does not know. Real nodes are in the end-to-end tests."""

import json

import httpx

from exo.mcp.memory import MemoryFit
from exo.mcp.models import DOWNLOAD_PROGRESS_TOTAL
from exo.models.catalog import QWEN25_CODER_15B, CatalogListing
from exo.models.catalog_api import DownloadDone, DownloadFailed, DownloadProgress, NodeCatalog, NodeCatalogModel
from exo.shared.types.api import ErrorBody
from exo.shared.types.cluster_api import ClusterSummary
from exo.shared.types.common import ModelId
from exo.shared.types.preparation import ModelPreparation, PreparationPhase
from tests.mcp.mcp_clients import text_of
from tests.mcp.scripted_node import Reply, error, scripted_tools, sse

MODEL = ModelId("qwen2.5-coder-1.5b-instruct")

# A real node reports its machine's real memory, so "too large for the cluster" is scripted: 1.5 GB free of 8 GB.
SMALL_CLUSTER = ClusterSummary(
    cluster="home",
    node_id="n1",
    master_node_id="n1",
    nodes_healthy=2,
    nodes_degraded=0,
    nodes_down=0,
    memory_total_bytes=8_000_000_000,
    memory_available_bytes=1_500_000_000,
    models=[],
    last_event_index=0,
)
LARGE = QWEN25_CODER_15B
LARGE_CATALOG = NodeCatalog(
    models_dir="/models",
    models=[NodeCatalogModel.of(CatalogListing(entry=LARGE, downloaded=False, path=None), "float32")],
)
ROOMY_CLUSTER = SMALL_CLUSTER.model_copy(
    update={"memory_available_bytes": 60_000_000_000, "memory_total_bytes": 64_000_000_000}
)
# The download tool checks the model fits before it asks the node to fetch it.
FITS: dict[str, Reply] = {"GET /v1/catalog": LARGE_CATALOG, "GET /v1/cluster": ROOMY_CLUSTER}
TOO_LARGE = (
    f"{LARGE.model_id} needs 7.1 GB of memory to serve; the cluster has 1.5 GB free (of 8.0 GB on 2 nodes): it is "
    "too large for the cluster's memory. Add a node with more memory (exo_add_peer, exo_discover) or pick a smaller "
    "model (exo_list_models)."
)


def snapshot(phase: PreparationPhase, done: int, total: int) -> DownloadProgress:
    preparation = ModelPreparation(
        model_id=MODEL, phase=phase, done_bytes=done, total_bytes=total, started_at=0.0, updated_at=0.0
    )
    return DownloadProgress(preparation=preparation)


async def test_progress_grows_with_every_notification_across_phases_whose_byte_counts_restart() -> None:
    events = [
        snapshot("downloading", 0, 1000),
        snapshot("downloading", 500, 1000),
        snapshot("downloading", 1000, 1000),
        snapshot("converting", 0, 4000),
        snapshot("converting", 1000, 4000),
        snapshot("converting", 4000, 4000),
        snapshot("ready", 4000, 4000),
        DownloadDone(model_id=MODEL, path="/models/qwen"),
    ]
    requests: list[httpx.Request] = []
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async with scripted_tools({**FITS, "POST /v1/catalog/download": sse(events)}, requests) as client:
        result = await client.call_tool("exo_download_model", {"model": MODEL}, progress_callback=on_progress)
    assert not result.is_error, result
    assert [progress for progress, _, _ in seen] == [0.0, 0.5, 1.0, 1.25, 2.0]
    assert {total for _, total, _ in seen} == {DOWNLOAD_PROGRESS_TOTAL}
    assert seen[1][2] == f"downloading {MODEL}: 500 bytes of 1.0 kB (50%)"
    assert seen[-1][2] == f"converting {MODEL}: 4.0 kB of 4.0 kB (100%)"
    assert [request.url.path for request in requests] == ["/v1/catalog", "/v1/cluster", "/v1/catalog/download"]
    assert json.loads(requests[-1].content) == {"model": MODEL}


async def test_a_download_the_node_reports_failed_is_an_error_result_with_its_reason() -> None:
    failed = DownloadFailed(
        error=ErrorBody(message="piece 3 failed its sha256 check", type="server_error", code="download_failed")
    )
    async with scripted_tools(
        {**FITS, "POST /v1/catalog/download": sse([snapshot("downloading", 10, 1000), failed])}, []
    ) as client:
        result = await client.call_tool("exo_download_model", {"model": MODEL})
    assert (result.is_error, text_of(result)) == (True, "piece 3 failed its sha256 check")


async def test_a_download_stream_that_ends_without_a_result_is_an_error_result() -> None:
    replies = {**FITS, "POST /v1/catalog/download": sse([snapshot("downloading", 10, 1000)])}
    async with scripted_tools(replies, []) as client:
        result = await client.call_tool("exo_download_model", {"model": MODEL})
    assert result.is_error
    assert text_of(result) == f"exo at http://scripted-node:52415 ended the download of {MODEL} without a result"


async def test_a_reply_in_an_unknown_shape_is_an_error_result_not_a_crash() -> None:
    replies = {"GET /health": httpx.Response(200, json={"status": "ok"})}
    replies["GET /v1/cluster"] = httpx.Response(200, json=[])
    async with scripted_tools(replies, []) as client:
        result = await client.call_tool("exo_status", {})
        listed = await client.list_tools()
    assert result.is_error
    assert text_of(result).startswith("/v1/cluster answered in an unexpected shape:")
    assert listed.tools


async def test_the_nodes_own_error_message_reaches_the_agent() -> None:
    replies = {"POST /v1/chat/completions": error(503, "model 'm' is still being prepared; retry shortly")}
    async with scripted_tools(replies, []) as client:
        result = await client.call_tool("exo_run_model", {"model": "m", "prompt": "hi"})
    assert (result.is_error, text_of(result)) == (True, "model 'm' is still being prepared; retry shortly")


async def test_running_a_model_too_large_for_the_cluster_names_the_numbers() -> None:
    replies: dict[str, Reply] = {
        "POST /v1/chat/completions": error(404, f"model '{LARGE.model_id}' is not served here", "model_not_found"),
        "GET /v1/catalog": LARGE_CATALOG,
        "GET /v1/cluster": SMALL_CLUSTER,
    }
    async with scripted_tools(replies, []) as client:
        result = await client.call_tool("exo_run_model", {"model": LARGE.model_id, "prompt": "hi"})
    assert (result.is_error, text_of(result)) == (True, TOO_LARGE)
    fit = MemoryFit.model_validate(result.structured_content)
    assert (fit.needed_bytes, fit.available_bytes, fit.fits) == (7_108_352_000, 1_500_000_000, False)


async def test_downloading_a_model_too_large_for_the_cluster_is_refused_before_any_download() -> None:
    requests: list[httpx.Request] = []
    replies: dict[str, Reply] = {"GET /v1/catalog": LARGE_CATALOG, "GET /v1/cluster": SMALL_CLUSTER}
    async with scripted_tools(replies, requests) as client:
        result = await client.call_tool("exo_download_model", {"model": LARGE.model_id})
    assert (result.is_error, text_of(result)) == (True, TOO_LARGE)
    assert [request.url.path for request in requests] == ["/v1/catalog", "/v1/cluster"]


async def test_a_catalog_model_that_fits_but_is_not_running_says_how_to_start_it() -> None:
    replies: dict[str, Reply] = {
        "POST /v1/chat/completions": error(404, f"model '{LARGE.model_id}' is not served here", "model_not_found"),
        "GET /v1/catalog": LARGE_CATALOG,
        "GET /v1/cluster": ROOMY_CLUSTER,
    }
    async with scripted_tools(replies, []) as client:
        result = await client.call_tool("exo_run_model", {"model": LARGE.model_id, "prompt": "hi"})
    assert result.is_error
    assert text_of(result) == (
        f"{LARGE.model_id} is in exo's catalog but not running; fetch it with exo_download_model, then start it with "
        f"`exo --model {LARGE.model_id}`. {LARGE.model_id} needs 7.1 GB of memory to serve; the cluster has 60.0 GB "
        "free (of 64.0 GB on 2 nodes)."
    )
