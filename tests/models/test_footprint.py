"""A checkpoint's footprint from its safetensors headers: per-layer and shared parameters and bytes."""

import json
from pathlib import Path

import mlx.core as mx
import pytest

from exo.models.footprint import FootprintError, read_footprint
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR


def test_the_per_layer_fixture_has_four_equal_layers_and_shared_embeddings() -> None:
    footprint = read_footprint(FIXTURE_MODELS_DIR / "tiny-qwen-tools-deep")
    assert footprint.num_layers == 4
    assert len(set(footprint.layer_parameters)) == 1
    config = json.loads((FIXTURE_MODELS_DIR / "tiny-qwen-tools-deep" / "config.json").read_text())
    # Tied embeddings and the final norm are the shared weights.
    assert footprint.shared_parameters == config["vocab_size"] * config["hidden_size"] + config["hidden_size"]
    parameters = footprint.shared_parameters + sum(footprint.layer_parameters)
    assert footprint.total_bytes(weights="float32") == 4 * parameters
    # Stored as float32 already: the file bytes are the float32 bytes.
    assert footprint.total_bytes(weights="stored") == footprint.total_bytes(weights="float32")


def test_a_quantized_checkpoint_counts_its_weights_dequantized(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"quantization": {"group_size": 64, "bits": 4}}))
    weight, scales, biases = mx.quantize(mx.ones((128, 256)), group_size=64, bits=4)
    mx.save_safetensors(
        str(tmp_path / "model.safetensors"),
        {
            "model.layers.0.mlp.up_proj.weight": weight,
            "model.layers.0.mlp.up_proj.scales": scales,
            "model.layers.0.mlp.up_proj.biases": biases,
            "model.norm.weight": mx.ones((256,)),
        },
    )
    footprint = read_footprint(tmp_path)
    assert footprint.layer_parameters == (128 * 256,)
    assert footprint.shared_parameters == 256
    assert footprint.layer_file_bytes[0] == weight.nbytes + scales.nbytes + biases.nbytes


def test_a_directory_without_weights_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FootprintError, match="has no safetensors weights"):
        read_footprint(tmp_path)
