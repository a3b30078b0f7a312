"""bench.float32_weights: the float32 copy mlx_lm.server is given holds the same weights, loadable by stock mlx-lm."""

import json
import shutil
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model, save_model

from bench.float32_weights import float32_copy

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "models" / "tiny-qwen-tools"


def _float16_model(destination: Path) -> Path:
    """The fixture's weights stored as float16, as the default model's checkpoint is."""
    model, _ = load_model(FIXTURE)
    model.set_dtype(mx.float16)
    for item in FIXTURE.iterdir():
        if item.is_file() and not item.name.endswith(".safetensors"):
            shutil.copy2(item, destination / item.name)
    save_model(destination, model)
    config = json.loads((destination / "config.json").read_text())
    (destination / "config.json").write_text(json.dumps({**config, "torch_dtype": "float16"}))
    return destination


def test_the_copy_is_float32_with_the_same_values(tmp_path: Path) -> None:
    (tmp_path / "f16").mkdir()
    source = _float16_model(tmp_path / "f16")
    copy = float32_copy(source, tmp_path / "f32")

    assert json.loads((copy / "config.json").read_text())["torch_dtype"] == "float32"
    assert (copy / "tokenizer.json").is_file()
    original, _ = load_model(source)
    converted, _ = load_model(copy)
    original_weights = dict(tree_flatten(original.parameters()))
    converted_weights = dict(tree_flatten(converted.parameters()))
    assert original_weights.keys() == converted_weights.keys()
    for name, weight in converted_weights.items():
        assert weight.dtype == mx.float32, name
        assert mx.array_equal(weight, original_weights[name].astype(mx.float32)).item(), name
