"""The tools' own logic against a scripted node: download progress that only grows across phases, failures the
node reports mid-download, replies in a shape the client does not know. Real nodes are in the end-to-end tests."""

import json

import httpx

from exo.mcp.models import DOWNLOAD_PROGRESS_TOTAL
from exo.shared.types.api import ErrorBody
from exo.shared.types.catalog_api import DownloadDone, DownloadFailed, DownloadProgress
from exo.shared.types.common import ModelId
from exo.shared.types.preparation import ModelPreparation, PreparationPhase
from tests.mcp.mcp_clients import text_of
from tests.mcp.scripted_node import error, scripted_tools, sse

MODEL = ModelId("qwen2.5-coder-1.5b-instruct")


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

    async with scripted_tools({"POST /v1/catalog/download": sse(events)}, requests) as client:
        result = await client.call_tool("exo_download_model", {"model": MODEL}, progress_callback=on_progress)
    assert not result.is_error, result
    assert [progress for progress, _, _ in seen] == [0.0, 0.5, 1.0, 1.25, 2.0]
    assert {total for _, total, _ in seen} == {DOWNLOAD_PROGRESS_TOTAL}
    assert seen[1][2] == f"downloading {MODEL}: 500 bytes of 1.0 kB (50%)"
    assert seen[-1][2] == f"converting {MODEL}: 4.0 kB of 4.0 kB (100%)"
    assert json.loads(requests[0].content) == {"model": MODEL}


async def test_a_download_the_node_reports_failed_is_an_error_result_with_its_reason() -> None:
    failed = DownloadFailed(
        error=ErrorBody(message="piece 3 failed its sha256 check", type="server_error", code="download_failed")
    )
    async with scripted_tools(
        {"POST /v1/catalog/download": sse([snapshot("downloading", 10, 1000), failed])}, []
    ) as client:
        result = await client.call_tool("exo_download_model", {"model": MODEL})
    assert (result.is_error, text_of(result)) == (True, "piece 3 failed its sha256 check")


async def test_a_download_stream_that_ends_without_a_result_is_an_error_result() -> None:
    async with scripted_tools({"POST /v1/catalog/download": sse([snapshot("downloading", 10, 1000)])}, []) as client:
        result = await client.call_tool("exo_download_model", {"model": MODEL})
    assert result.is_error
    assert text_of(result) == f"exo at http://scripted-node:52415 ended the download of {MODEL} without a result"


async def test_a_reply_in_an_unknown_shape_is_an_error_result_not_a_crash() -> None:
    replies = {"GET /health": httpx.Response(200, json={"status": "ok"}), "GET /state": httpx.Response(200, json=[])}
    async with scripted_tools(replies, []) as client:
        result = await client.call_tool("exo_status", {})
        listed = await client.list_tools()
    assert result.is_error
    assert text_of(result).startswith("/state answered in an unexpected shape:")
    assert listed.tools


async def test_the_nodes_own_error_message_reaches_the_agent() -> None:
    replies = {"POST /v1/chat/completions": error(503, "model 'm' is still being prepared; retry shortly")}
    async with scripted_tools(replies, []) as client:
        result = await client.call_tool("exo_run_model", {"model": "m", "prompt": "hi"})
    assert (result.is_error, text_of(result)) == (True, "model 'm' is still being prepared; retry shortly")
