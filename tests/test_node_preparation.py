"""A node shows the preparation of its models in /state: how a GGUF conversion went, none for a ready directory."""

from pathlib import Path
from typing import Any

import anyio

from exo.node import NodeConfig
from tests.exo_server import fixture_model
from tests.in_process_node import in_process_node
from tests.models.tiny_gguf import build_model, build_tokenizer, write_gguf


async def test_a_converted_gguf_is_reported_ready_with_its_byte_counts_and_a_directory_is_not_listed(
    tmp_path: Path,
) -> None:
    gguf_path = tmp_path / "Tiny-Prep.gguf"
    tokenizer = build_tokenizer()
    write_gguf(gguf_path, "qwen2", build_model("qwen2", tokenizer, seed=11), tokenizer, with_output=True)
    directory = fixture_model("tiny-qwen-tools")
    config = NodeConfig(models=(str(gguf_path), str(directory)), models_dir=tmp_path / "models")
    async with in_process_node(config, tmp_path) as (node, client):
        with anyio.fail_after(120):
            while len(node.master_client.state.runners) < 2:
                await anyio.sleep(0.05)
        state: dict[str, Any] = (await client.get("/state")).json()

    [node_state] = state["nodes"].values()
    assert node_state["preparing"] == []
    preparations = node_state["preparations"]
    assert list(preparations) == ["tiny-prep"]
    converted = preparations["tiny-prep"]
    assert converted["phase"] == "ready"
    assert converted["done_bytes"] == converted["total_bytes"] > 0
    assert converted["error"] is None
    assert converted["updated_at"] >= converted["started_at"]
