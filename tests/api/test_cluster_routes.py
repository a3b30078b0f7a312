"""The cluster endpoints through the production app: typed answers, documented in OpenAPI, OpenAI-shaped errors."""

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from exo.shared.types.cluster_api import ClusterMetrics, ClusterNode, ClusterNodeList, ClusterSummary, PeerConnection
from tests.api.inprocess_app import SCRIPTED_MODEL, SCRIPTED_NODE, scripted_app

CLUSTER_RESPONSES = {
    ("get", "/v1/cluster"): "ClusterSummary",
    ("get", "/v1/cluster/nodes"): "ClusterNodeList",
    ("get", "/v1/cluster/nodes/{node_id}"): "ClusterNode",
    ("get", "/v1/cluster/metrics"): "ClusterMetrics",
    ("post", "/v1/cluster/peers"): "PeerConnection",
    ("post", "/v1/cluster/discover"): "DiscoveryReport",
    ("get", "/v1/cluster/instances"): "InstanceList",
    ("post", "/v1/cluster/instances"): "PlacedInstanceView",
}


@pytest.fixture
def client() -> Iterator[TestClient]:
    application, _ = scripted_app()
    with TestClient(application) as test_client:
        yield test_client


def test_every_cluster_answer_is_a_named_schema_in_openapi(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    for (method, path), model in CLUSTER_RESPONSES.items():
        content = schema["paths"][path][method]["responses"]["200"]["content"]["application/json"]
        assert content["schema"] == {"$ref": f"#/components/schemas/{model}"}, (method, path)
        assert schema["paths"][path][method]["description"], (method, path)
    assert "text/plain" in str(schema["paths"]["/metrics"]["get"]["responses"]["200"]["content"])


def test_the_summary_nodes_and_metrics_validate_against_their_models(client: TestClient) -> None:
    summary = ClusterSummary.model_validate(client.get("/v1/cluster").json())
    assert (summary.cluster, summary.node_id, summary.master_node_id) == ("scripted", SCRIPTED_NODE, SCRIPTED_NODE)
    assert [model.model_id for model in summary.models] == [SCRIPTED_MODEL]
    nodes = ClusterNodeList.model_validate(client.get("/v1/cluster/nodes").json())
    assert [node.node_id for node in nodes.data] == [SCRIPTED_NODE]
    node = ClusterNode.model_validate(client.get(f"/v1/cluster/nodes/{SCRIPTED_NODE}").json())
    assert node.is_master
    assert node.status == "healthy"
    metrics = ClusterMetrics.model_validate(client.get("/v1/cluster/metrics").json())
    assert [model.model_id for model in metrics.models] == [SCRIPTED_MODEL]


def test_an_unknown_node_is_an_openai_shaped_404(client: TestClient) -> None:
    response = client.get("/v1/cluster/nodes/nobody")
    assert response.status_code == 404
    assert response.json()["error"] == {
        "message": "no node 'nobody' in this cluster",
        "type": "not_found_error",
        "param": "node_id",
        "code": None,
    }


def test_prometheus_metrics_are_text_that_parses(client: TestClient) -> None:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    names = {family.name for family in text_string_to_metric_families(response.text)}
    assert {"exo_node_up", "exo_requests", "exo_tasks", "exo_node_memory_available_bytes"} <= names


@pytest.mark.parametrize("endpoint", ["", "tcp/", "udp/10.0.0.1:52414", "tcp/host:0", "tcp/host:99999", "10.0.0.1"])
def test_a_malformed_peer_endpoint_is_a_400_naming_the_field(client: TestClient, endpoint: str) -> None:
    response = client.post("/v1/cluster/peers", json={"endpoint": endpoint})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("endpoint", "invalid_endpoint")
    assert "tcp/HOST:PORT" in error["message"]


def test_a_bare_host_and_port_is_read_as_tcp() -> None:
    application, master = scripted_app()
    with TestClient(application) as test_client:
        response = test_client.post("/v1/cluster/peers", json={"endpoint": "10.0.0.7:52414"})
    assert response.status_code == 200
    assert PeerConnection.model_validate(response.json()).endpoint == "tcp/10.0.0.7:52414"
    assert master.peers_added == ["tcp/10.0.0.7:52414"]


def test_a_placement_that_fits_nowhere_is_an_openai_shaped_400_and_bad_bodies_are_refused(client: TestClient) -> None:
    refused = client.post("/v1/cluster/instances", json={"model": "big", "min_nodes": 2})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "insufficient_memory",
        "min_nodes",
    )
    assert error["message"] == "scripted: big does not fit over 2 nodes"
    indivisible = client.post("/v1/cluster/instances", json={"model": "big", "min_nodes": 2, "parallel": "tensor"})
    assert indivisible.status_code == 400
    error = indivisible.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "indivisible_heads", "parallel")
    assert error["message"] == "scripted: big has 3 heads, not divisible by 2"
    bad_bodies: list[dict[str, object]] = [
        {"model": "big", "min_nodes": 0},
        {"min_nodes": 2},
        {"model": "big", "min_nodes": "2"},
        {"model": "big", "parallel": "sideways"},
    ]
    for body in bad_bodies:
        assert client.post("/v1/cluster/instances", json=body).status_code == 400, body
    assert client.get("/v1/cluster/instances").json() == {"object": "list", "data": [], "unplaced": []}
