"""One API key guards the whole cluster, with two real nodes on 127.0.0.1: alpha is started with `--api-key`,
beta without. Once beta has joined, beta requires alpha's key everywhere (the API, `/state`, the dashboard's data,
`/mcp`), accepts it, and never shows the key's verifier; a wrong key is refused on both nodes."""

import time
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest

from tests.cluster.local_cluster import ClusterNode, LocalCluster, local_cluster
from tests.exo_server import fixture_model
from tests.fixtures.fixture_specs import user
from tests.mcp.mcp_clients import exo_mcp_client, text_of

MODEL = "tiny-qwen-tools"
KEY = "cluster-wide-key-0123"
CHAT: dict[str, Any] = {"model": MODEL, "messages": [user("Hello!")], "max_tokens": 4}
JOINED_WITHIN_S = 120.0


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_cluster(tmp_path_factory.mktemp("api-key"), "api-key") as running:
        yield running


def _get(node: ClusterNode, path: str, key: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{node.base_url}{path}", headers=headers, timeout=30)


def _beta_serves_alphas_model(beta: ClusterNode) -> bool:
    response = _get(beta, "/v1/models", KEY)
    return response.status_code == 200 and MODEL in {card["id"] for card in response.json()["data"]}


async def _mcp_status(node: ClusterNode, key: str) -> str:
    async with exo_mcp_client("http", node.base_url, key) as client:
        return text_of(await client.call_tool("exo_list_models", {}))


def test_a_node_without_a_key_requires_the_key_of_its_cluster(cluster: LocalCluster) -> None:
    alpha = cluster.launch("alpha", [fixture_model(MODEL)], extra_arguments=["--api-key", KEY])
    cluster.wait_until(alpha, lambda: _get(alpha, "/health", None).status_code == 200, "its API", JOINED_WITHIN_S)
    beta = cluster.launch("beta", peers=[alpha])
    cluster.wait_until(beta, lambda: _beta_serves_alphas_model(beta), "alpha's model on beta", JOINED_WITHIN_S)

    for path in ("/v1/models", "/state", "/v1/cluster/nodes"):
        refused = _get(beta, path, None)
        assert refused.status_code == 401, (path, refused.text)
        assert refused.json()["error"]["code"] == "invalid_api_key"
        assert _get(beta, path, "wrong-key-0123456").status_code == 401, path
        assert _get(alpha, path, "wrong-key-0123456").status_code == 401, path
    chat = httpx.post(f"{beta.base_url}/v1/chat/completions", json=CHAT, timeout=60)
    assert chat.status_code == 401, chat.text
    assert httpx.post(f"{beta.base_url}/mcp", json={}, timeout=30).status_code == 401

    # The dashboard's page loads (it holds no data) and asks for the key; its data needs the key.
    page = _get(beta, "/", None)
    assert page.status_code == 200
    answered = httpx.post(f"{beta.base_url}/v1/chat/completions", json=CHAT, headers={"x-api-key": KEY}, timeout=60)
    assert answered.status_code == 200, answered.text

    state = _get(beta, "/state", KEY)
    assert state.status_code == 200
    nodes = state.json()["nodes"]
    assert {node["facts"]["name"] for node in nodes.values()} == {"alpha", "beta"}
    assert all(node["facts"]["api_key_verifier"] is None for node in nodes.values())
    assert KEY not in state.text

    # beta's own /mcp tools reach beta's API although beta has no key of its own.
    listed = anyio.run(_mcp_status, beta, KEY)
    assert MODEL in listed, listed
    started = time.monotonic()
    assert _get(beta, "/v1/models", KEY).status_code == 200
    assert time.monotonic() - started < 5.0  # the key, once checked, is remembered
