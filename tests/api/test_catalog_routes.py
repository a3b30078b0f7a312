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
from exo.shared.local_backend import local_weights_in_memory, mlx_backend
from exo.shared.types.cpu_kernels import CpuKernelsSetting, CpuWeights
from exo.shared.types.footprint import INT8_OVERHEAD, weights_in_memory
from tests.api.inprocess_app import scripted_app


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    return tmp_path / "models"


@pytest.fixture
def client(models_dir: Path) -> Iterator[TestClient]:
    """A node started with --show-model-paths: its answers name the directories (tested apart below without it)."""
    application, _ = scripted_app(NodeConfig(models_dir=models_dir, show_model_paths=True))
    with TestClient(application) as test_client:
        yield test_client


@pytest.fixture
def private_client(models_dir: Path) -> Iterator[TestClient]:
    """A node as started by default: no path on its disk in any answer."""
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
    weights = local_weights_in_memory()
    assert [model.weights_in_memory for model in catalog.models] == [weights] * len(CATALOG)
    assert [model.memory_bytes for model in catalog.models] == [entry.memory_bytes(weights) for entry in CATALOG]
    downloaded = {model.listing.entry.model_id: model.listing.path for model in catalog.models}
    assert downloaded == {DEFAULT_MODEL_ID: path, "qwen2.5-coder-1.5b-instruct": None}


@pytest.mark.parametrize(
    ("cpu_kernels", "cpu_weights"), [("auto", "float32"), ("auto", "int8"), ("off", "int8")], ids=str
)
def test_the_catalog_memory_is_for_the_weights_the_node_is_started_to_hold(
    models_dir: Path, cpu_kernels: CpuKernelsSetting, cpu_weights: CpuWeights
) -> None:
    """The dashboard's and the MCP tools' memory figure: int8 under `--cpu-weights int8` on a CPU machine, float32
    under the default, as stored (float16) under `--cpu-kernels off` or on a GPU."""
    config = NodeConfig(models_dir=models_dir, cpu_kernels=cpu_kernels, cpu_weights=cpu_weights)
    application, _ = scripted_app(config)
    with TestClient(application) as test_client:
        catalog = NodeCatalog.model_validate(test_client.get("/v1/catalog").json())
    weights = weights_in_memory(mlx_backend(), cpu_kernels, cpu_weights)
    for model in catalog.models:
        assert model.weights_in_memory == weights
        assert model.memory_bytes == model.listing.entry.memory_bytes(weights)
    if mlx_backend() == "cpu":
        expected = {"float32": 4.0, "int8": 1 + INT8_OVERHEAD}.get(cpu_weights) if cpu_kernels == "auto" else 2.0
        assert [model.memory_bytes / model.listing.entry.weight_values for model in catalog.models] == pytest.approx(
            [expected] * len(CATALOG), rel=1e-6
        )


def test_without_show_model_paths_the_catalog_names_no_directory(private_client: TestClient, models_dir: Path) -> None:
    imported(models_dir, DEFAULT_MODEL_ID)
    listing = private_client.get("/v1/catalog")
    download = private_client.post("/v1/catalog/download", json={"model": DEFAULT_MODEL_ID})

    for answer in (listing, download):
        assert answer.status_code == 200
        assert str(models_dir) not in answer.text
        assert str(Path.home()) not in answer.text
    catalog = NodeCatalog.model_validate(listing.json())
    assert catalog.models_dir == "<models dir>"
    downloaded = {model.listing.entry.model_id: model.listing.path for model in catalog.models}
    assert downloaded[DEFAULT_MODEL_ID] == Path("<models dir>") / DEFAULT_MODEL_ID
    events = [json.loads(line.removeprefix("data: ")) for line in download.text.splitlines() if line]
    assert [DownloadDone.model_validate(event) for event in events] == [
        DownloadDone(model_id=DEFAULT_MODEL_ID, path=f"<models dir>/{DEFAULT_MODEL_ID}")
    ]


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
