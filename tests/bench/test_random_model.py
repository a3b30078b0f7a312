"""bench.random_model: a model of the source's shape, with the source's tokenizer, that mlx-lm loads and runs."""

import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm import load

from bench.random_model import ReducedShape, write_random_model
from tests.exo_server import fixture_model


def test_random_weights_keep_the_shape_and_tokenizer_and_differ_in_value(tmp_path: Path) -> None:
    source = fixture_model("tiny-qwen-tools")
    count = write_random_model(source, tmp_path / "random", "bfloat16")

    original, original_tokenizer = load(str(source))[:2]
    random, random_tokenizer = load(str(tmp_path / "random"))[:2]
    original_shapes: dict[str, mx.array] = tree_flatten(original.parameters(), destination={})  # pyright: ignore[reportAssignmentType]
    random_shapes: dict[str, mx.array] = tree_flatten(random.parameters(), destination={})  # pyright: ignore[reportAssignmentType]
    assert {name: value.shape for name, value in random_shapes.items()} == {
        name: value.shape for name, value in original_shapes.items()
    }
    assert count == sum(value.size for value in original_shapes.values())
    assert all(value.dtype == mx.bfloat16 for value in random_shapes.values())
    embedding = "model.embed_tokens.weight"
    assert not mx.allclose(random_shapes[embedding].astype(mx.float32), original_shapes[embedding].astype(mx.float32))
    text = "Hello, tools!"
    assert random_tokenizer.encode(text) == original_tokenizer.encode(text)
    assert json.loads((tmp_path / "random" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    vocabulary = json.loads((source / "config.json").read_text())["vocab_size"]
    assert random(mx.array([random_tokenizer.encode(text)])).shape[-1] == vocabulary


def test_a_reduced_shape_keeps_the_vocabulary_and_tokenizer_and_runs(tmp_path: Path) -> None:
    source = fixture_model("tiny-qwen-tools")
    shape = ReducedShape(layers=1, hidden_size=32, intermediate_size=64, attention_heads=2, key_value_heads=1)
    write_random_model(source, tmp_path / "reduced", "float32", shape)
    config = json.loads((tmp_path / "reduced" / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["head_dim"]) == (1, 32, 16)
    reduced, tokenizer = load(str(tmp_path / "reduced"))[:2]
    original_tokenizer = load(str(source))[1]
    text = "Hello, tools!"
    assert tokenizer.encode(text) == original_tokenizer.encode(text)
    vocabulary = json.loads((source / "config.json").read_text())["vocab_size"]
    assert reduced(mx.array([tokenizer.encode(text)])).shape[-1] == vocabulary
