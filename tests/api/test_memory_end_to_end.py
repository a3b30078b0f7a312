"""Memory figures on a real node, by how it holds weights (`--cpu-weights float32|int8`): placement over HTTP plans
the format's size, /v1/models shows it for a whole model and a placed one (and the runner's measured weights agree),
as does Ollama's /api/ps, and the catalog the dashboard reads (/v1/catalog) shows the catalog's models in that
format."""

from collections.abc import Iterator
from typing import Any, cast

import httpx
import pytest

from exo.master.pipeline_placement import rank_need
from exo.models.catalog import CATALOG
from exo.models.catalog_api import NodeCatalog
from exo.models.checkpoint_facts import checkpoint_facts
from exo.models.footprint import read_footprint
from exo.shared.local_backend import local_weights_in_memory
from exo.shared.types.api import ModelList
from exo.shared.types.cluster_api import PlacedInstanceView
from exo.shared.types.footprint import INT8_OVERHEAD, WeightsInMemory, held_bytes
from tests.exo_server import ExoServer, fixture_model, running_exo

WHOLE = "tiny-qwen-tools"
PLACED = "tiny-qwen-tools-deep"
READY_WITHIN_S = 120.0


@pytest.fixture(scope="module", params=["float32", "int8"])
def node(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ExoServer, str]]:
    cpu_weights = cast(str, request.param)
    home = tmp_path_factory.mktemp(f"memory-{cpu_weights}")
    with running_exo([fixture_model(WHOLE)], home, ["--cpu-weights", cpu_weights]) as server:
        yield server, cpu_weights


def _held(cpu_weights: str) -> WeightsInMemory:
    return local_weights_in_memory("auto", "int8" if cpu_weights == "int8" else "float32")


def test_placement_plans_and_v1_models_shows_the_memory_of_the_format_the_node_loads(
    node: tuple[ExoServer, str],
) -> None:
    server, cpu_weights = node
    weights = _held(cpu_weights)
    placed_path = fixture_model(PLACED)
    footprint = read_footprint(placed_path)
    answer = httpx.post(
        f"{server.base_url}/v1/cluster/instances", json={"model": str(placed_path), "min_nodes": 1}, timeout=60
    )
    assert answer.status_code == 200, answer.text
    placed = PlacedInstanceView.model_validate(answer.json())
    assert [rank.planned_bytes for rank in placed.ranks] == [
        rank_need(footprint, 0, footprint.num_layers, weights=weights)
    ]
    server.wait_until_all_ready(2, timeout=READY_WITHIN_S)

    cards = {card.id: card for card in ModelList.model_validate(httpx.get(f"{server.base_url}/v1/models").json()).data}
    whole, deep = cards[WHOLE], cards[placed.model_id]
    assert (whole.weights_in_memory, deep.weights_in_memory) == (weights, weights)
    facts = checkpoint_facts(fixture_model(WHOLE))
    assert whole.memory_bytes == held_bytes(facts.parameter_count, facts.file_bytes, weights=weights)
    assert deep.memory_bytes == footprint.total_bytes(weights=weights)
    # What the runners measured they hold agrees with the figure (the scales per row of a 64-wide toy model and its
    # float32 norms and biases are a few percent more than INT8_OVERHEAD allows for a real one).
    measured = {runner["model_id"]: _weights_bytes(runner) for runner in server.runners()}
    assert measured[WHOLE] == pytest.approx(whole.memory_bytes, rel=0.15)
    assert measured[placed.model_id] == pytest.approx(deep.memory_bytes, rel=0.15)
    # Ollama's /api/ps gives a loaded model's memory as its size: the same figure.
    loaded = httpx.get(f"{server.base_url}/api/ps").json()["models"]
    assert {entry["model"]: entry["size"] for entry in loaded} == {
        WHOLE: whole.memory_bytes,
        placed.model_id: deep.memory_bytes,
    }
    if weights == "int8":
        assert whole.memory_bytes == int(facts.parameter_count * (1 + INT8_OVERHEAD))
    elif weights == "float32":
        assert whole.memory_bytes == 4 * facts.parameter_count


def test_the_dashboards_catalog_shows_memory_in_the_format_the_node_loads(node: tuple[ExoServer, str]) -> None:
    server, cpu_weights = node
    weights = _held(cpu_weights)
    catalog = NodeCatalog.model_validate(httpx.get(f"{server.base_url}/v1/catalog").json())
    assert [(model.weights_in_memory, model.memory_bytes) for model in catalog.models] == [
        (weights, entry.memory_bytes(weights)) for entry in CATALOG
    ]


def _weights_bytes(runner: dict[str, object]) -> int:
    metadata = cast(dict[str, Any], runner["metadata"])
    measured = metadata["weights_bytes"]
    assert isinstance(measured, int), metadata
    return measured
