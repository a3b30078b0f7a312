"""Which checkpoint files a pipeline rank needs: its layers' files and the shared ones, or all of an unsplit one."""

import json
from pathlib import Path

from exo.models.shard_files import files_for_layers, missing_weight_files, needed_weight_files
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR

WEIGHT_MAP = {
    "model.embed_tokens.weight": "shared.safetensors",
    "model.norm.weight": "shared.safetensors",
    "model.layers.0.mlp.up_proj.weight": "a.safetensors",
    "model.layers.1.mlp.up_proj.weight": "a.safetensors",
    "model.layers.2.mlp.up_proj.weight": "b.safetensors",
    "model.layers.2.self_attn.q_proj.weight": "c.safetensors",
    "model.layers.10.mlp.up_proj.weight": "d.safetensors",
    "lm_head.weight": "head.safetensors",
}


def test_a_rank_needs_the_files_of_its_layers_and_of_the_weights_outside_any_layer() -> None:
    assert files_for_layers(WEIGHT_MAP, 0, 2) == ("a.safetensors", "head.safetensors", "shared.safetensors")
    # A layer spread over two files needs both; layer 10 is not layer 1 (numbers are matched whole).
    assert files_for_layers(WEIGHT_MAP, 2, 3) == (
        "b.safetensors",
        "c.safetensors",
        "head.safetensors",
        "shared.safetensors",
    )
    assert files_for_layers(WEIGHT_MAP, 10, 11) == ("d.safetensors", "head.safetensors", "shared.safetensors")


def test_the_per_layer_fixture_splits_and_a_single_file_checkpoint_does_not(tmp_path: Path) -> None:
    deep = FIXTURE_MODELS_DIR / "tiny-qwen-tools-deep"
    weight_map: dict[str, str] = json.loads((deep / "model.safetensors.index.json").read_text())["weight_map"]
    layer_3_file = weight_map["model.layers.3.self_attn.q_proj.weight"]
    shared_file = weight_map["model.embed_tokens.weight"]
    assert needed_weight_files(deep, 3, 4) == tuple(sorted({layer_3_file, shared_file}))
    assert len(needed_weight_files(deep, 0, None)) == 5
    assert needed_weight_files(FIXTURE_MODELS_DIR / "tiny-qwen-tools", 1, 2) == ("model.safetensors",)
    assert missing_weight_files(tmp_path, 0, 1) == ["model.safetensors"]
