"""The node's catalog routes in process: the catalog as found in the node's models directory, and a download's
event stream for a model that is already there (the full fetch and conversion is tested in tests/mcp)."""

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from exo.models.catalog import CATALOG, DEFAULT_MODEL_ID
from exo.models.catalog_api import DownloadDone, NodeCatalog
from exo.node import NodeConfig
from tests.master.inprocess_app import scripted_app


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    return tmp_path / "models"


@pytest.fixture
def client(models_dir: Path) -> Iterator[TestClient]:
    application, _ = scripted_app(NodeConfig(models_dir=models_dir))
    with TestClient(application) as test_client:
        yield test_client


def imported(models_dir: Path, model_id: str) -> Path:
    """Make `model_id` look imported (an import ends by writing config.json)."""
    directory = models_dir / model_id
    directory.mkdir(parents=True)
    (directory / "config.json").write_text("{}")
    return directory


def test_the_catalog_lists_every_entry_with_its_memory_and_whether_it_is_downloaded(
    client: TestClient, models_dir: Path
) -> None:
    path = imported(models_dir, DEFAULT_MODEL_ID)
    catalog = NodeCatalog.model_validate(client.get("/v1/catalog").json())
    assert catalog.models_dir == str(models_dir)
    assert [model.listing.entry for model in catalog.models] == list(CATALOG)
    assert [model.memory_bytes for model in catalog.models] == [entry.memory_bytes() for entry in CATALOG]
    downloaded = {model.listing.entry.model_id: model.listing.path for model in catalog.models}
    assert downloaded == {DEFAULT_MODEL_ID: path, "qwen2.5-coder-1.5b-instruct": None}


def test_downloading_a_model_that_is_there_answers_done_at_once(client: TestClient, models_dir: Path) -> None:
    path = imported(models_dir, DEFAULT_MODEL_ID)
    response = client.post("/v1/catalog/download", json={"model": DEFAULT_MODEL_ID})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line.removeprefix("data: ")) for line in response.text.splitlines() if line]
    assert [DownloadDone.model_validate(event) for event in events] == [
        DownloadDone(model_id=DEFAULT_MODEL_ID, path=str(path))
    ]


def test_a_model_outside_the_catalog_is_a_404_naming_the_catalog(client: TestClient) -> None:
    response = client.post("/v1/catalog/download", json={"model": "gpt-5"})
    assert response.status_code == 404
    assert response.json() == {
        "error": {
            "message": "'gpt-5' is not in exo's model catalog (it lists: "
            + ", ".join(entry.model_id for entry in CATALOG)
            + ")",
            "type": "not_found_error",
            "param": "model",
            "code": "model_not_found",
        }
    }
    assert client.post("/v1/catalog/download", json={}).status_code == 400


def test_the_catalog_routes_are_behind_the_api_key(models_dir: Path) -> None:
    application, _ = scripted_app(NodeConfig(models_dir=models_dir, api_key="catalog-key"))
    with TestClient(application) as keyed:
        assert keyed.get("/v1/catalog").status_code == 401
        assert keyed.post("/v1/catalog/download", json={"model": DEFAULT_MODEL_ID}).status_code == 401
        assert not models_dir.exists()  # nothing was fetched
        assert keyed.get("/v1/catalog", headers={"Authorization": "Bearer catalog-key"}).status_code == 200
