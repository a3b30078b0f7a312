"""exo_place_model through the official `mcp` SDK client against two real nodes that hold no model at start: `alpha`
(its files the fixture checkout's) and `beta`, joined through `--peer`. The tool takes the placement API's
`parallel` choice: placed with `tensor` over both nodes, the instance says so and why, every rank runs every layer,
and it serves. A choice outside pipeline|tensor|auto, and a model whose heads do not divide over the nodes, are
error results that say what is wrong.
"""

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from uuid import uuid4

import pytest

from exo.shared.types.cluster_api import ClusterSummary, PlacedInstanceView
from tests.cluster.local_cluster import ClusterNode, LocalCluster, local_cluster
from tests.exo_server import fixture_model
from tests.mcp.mcp_clients import TRANSPORTS, McpTransport, exo_mcp_client, text_of

DEEP = "tiny-qwen-tools-deep"  # 4 attention heads, 2 KV heads, MLP width 128: divides over 2 nodes
PLACED_WITHIN_S = 240.0


@dataclass(frozen=True)
class TwoNodes:
    running: LocalCluster
    alpha: ClusterNode
    beta: ClusterNode


def _healthy(node: ClusterNode) -> int:
    return ClusterSummary.model_validate(node.get("/v1/cluster")).nodes_healthy


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoNodes]:
    with local_cluster(tmp_path_factory.mktemp("exo-mcp-place"), f"mcp-place-{uuid4().hex[:8]}") as running:
        alpha = running.start("alpha")
        beta = running.start("beta", peers=[alpha])
        running.wait_until(alpha, lambda: _healthy(alpha) == 2, "beta to join", 60)
        yield TwoNodes(running, alpha, beta)


async def test_place_with_parallel_tensor_splits_the_model_by_matrices_over_both_nodes(
    two_nodes: TwoNodes,
) -> None:
    alpha, beta = two_nodes.alpha, two_nodes.beta
    arguments = {"model": str(fixture_model(DEEP)), "min_nodes": 2, "parallel": "tensor"}
    async with exo_mcp_client("stdio", alpha.base_url, None) as client:
        result = await client.call_tool("exo_place_model", arguments)
    assert not result.is_error, result
    placed = PlacedInstanceView.model_validate(result.structured_content)
    assert (placed.model_id, placed.parallel, placed.parallel_reason) == (DEEP, "tensor", "tensor asked for")
    assert (placed.world_size, placed.min_nodes, placed.degraded) == (2, 2, False)
    assert {rank.node_id for rank in placed.ranks} == {alpha.node_id, beta.node_id}
    assert [(rank.start_layer, rank.end_layer) for rank in placed.ranks] == [(0, 4), (0, 4)]
    text = text_of(result)
    assert f"{DEEP}: instance {placed.instance_id} over 2 node(s), split by matrices (tensor)" in text
    assert "Why this split: tensor asked for." in text
    # The cluster API shows the same instance, and it comes to serve.
    (listed,) = beta.instances().data
    assert (listed.instance_id, listed.parallel, listed.parallel_reason) == (
        placed.instance_id,
        "tensor",
        "tensor asked for",
    )
    two_nodes.running.wait_until(alpha, alpha.one_instance_ready, "the tensor split to serve", PLACED_WITHIN_S)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_parallel_choice_outside_the_three_is_an_error_naming_the_argument(
    transport: McpTransport, two_nodes: TwoNodes
) -> None:
    alpha = two_nodes.alpha
    arguments = {"model": str(fixture_model(DEEP)), "min_nodes": 2, "parallel": "sideways"}
    async with exo_mcp_client(transport, alpha.base_url, None) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        result = await client.call_tool("exo_place_model", arguments)
        still = await client.call_tool("exo_status", {})
    schema = tools["exo_place_model"].input_schema["properties"]["parallel"]
    assert (schema["enum"], schema["default"]) == (["pipeline", "tensor", "auto"], "auto")
    assert result.is_error, result
    text = text_of(result)
    assert "parallel" in text
    assert "'pipeline', 'tensor' or 'auto'" in text, text
    assert not still.is_error, still


async def test_a_tensor_split_whose_heads_do_not_divide_is_an_error_with_the_counts(
    two_nodes: TwoNodes, tmp_path: Path
) -> None:
    alpha = two_nodes.alpha
    odd = tmp_path / "tiny-qwen-odd-heads"
    shutil.copytree(fixture_model("tiny-qwen-tools"), odd)
    config = json.loads((odd / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps({**config, "num_attention_heads": 3, "num_key_value_heads": 1}))
    async with exo_mcp_client("http", alpha.base_url, None) as client:
        result = await client.call_tool("exo_place_model", {"model": str(odd), "min_nodes": 2, "parallel": "tensor"})
    assert result.is_error, result
    text = text_of(result)
    assert "cannot be split by tensor parallel over 2 nodes" in text
    assert "(attention heads 3, KV heads 1, MLP width 128)" in text
