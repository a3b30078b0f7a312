"""GGUF → mlx-lm directory: weights, config and tokenizer survive the round trip."""

import json
from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np
import pytest
from gguf import TokenType
from mlx import nn
from mlx_lm import load

from exo.models.checkpoint_facts import checkpoint_facts
from exo.models.errors import ModelLoadError
from exo.models.footprint import read_footprint
from exo.models.gguf_import import hf_tensor_name, import_gguf
from exo.models.gguf_source import KEPT_GGUF_NAME, kept_gguf, read_gguf_source
from exo.models.gguf_tokenizer import find_untrained_markers
from tests.models.tiny_gguf import (
    CONTROL_TOKENS,
    TRAINED_MARKER,
    UNTRAINED_MARKERS,
    TinyTokenizer,
    build_model,
    build_tokenizer,
    make_model,
    write_gguf,
)

SAMPLES = [
    "def weather(city, 3): return Paris",
    "Hello, world! What's the weather in Paris?\n\n  indented 12345",
    'naïve café {"name": "get_weather"} émoji 🙂',
]


@pytest.fixture(scope="module")
def tiny_tokenizer() -> TinyTokenizer:
    return build_tokenizer()


def _logits(model: nn.Module, token_ids: list[int]) -> np.ndarray:
    output: mx.array = model(mx.array([token_ids]))
    return np.array(output.astype(mx.float32))


@pytest.mark.parametrize(("arch", "with_output"), [("qwen2", True), ("qwen2", False), ("llama", True)])
def test_imported_model_reproduces_source_logits(
    tmp_path: Path, tiny_tokenizer: TinyTokenizer, arch: str, with_output: bool
) -> None:
    weights = build_model(arch, tiny_tokenizer, seed=7)
    stored = write_gguf(tmp_path / "tiny.gguf", arch, weights, tiny_tokenizer, with_output=with_output)
    out_dir = import_gguf(tmp_path / "tiny.gguf", tmp_path / "imported")

    imported = load(str(out_dir))[0]
    imported.set_dtype(mx.float32)
    reference = make_model(arch, len(tiny_tokenizer.tokens), tied=not with_output)
    # The importer writes float16, so the reference gets the GGUF's values rounded the same way.
    reference.load_weights(
        [(name, mx.array(value.astype(np.float16).astype(np.float32))) for name, value in stored.items()]
    )

    token_ids = [3, 17, 250, 42, 99, 5, 321, 64]
    expected = _logits(reference, token_ids)
    actual = _logits(imported, token_ids)
    assert actual.shape == (1, len(token_ids), len(tiny_tokenizer.tokens))
    np.testing.assert_allclose(actual, expected, atol=1e-4, rtol=1e-4)
    config = json.loads((out_dir / "config.json").read_text())
    assert config["model_type"] == arch
    assert config["tie_word_embeddings"] is (not with_output)


def test_tokenizer_round_trips_and_demotes_untrained_markers(tmp_path: Path, tiny_tokenizer: TinyTokenizer) -> None:
    weights = build_model("qwen2", tiny_tokenizer, seed=1)
    write_gguf(tmp_path / "tiny.gguf", "qwen2", weights, tiny_tokenizer, with_output=True)
    tokenizer = load(str(import_gguf(tmp_path / "tiny.gguf", tmp_path / "imported")))[1]
    ids = {token: index for index, token in enumerate(tiny_tokenizer.tokens)}

    for text in SAMPLES:
        encoded: list[int] = tokenizer.encode(text, add_special_tokens=False)
        assert encoded == tiny_tokenizer.reference.encode(text).ids
        assert tokenizer.decode(encoded) == text
    for token in CONTROL_TOKENS:
        assert tokenizer.encode(token, add_special_tokens=False) == [ids[token]]
    assert tokenizer.encode(TRAINED_MARKER, add_special_tokens=False) == [ids[TRAINED_MARKER]]
    for marker in UNTRAINED_MARKERS:
        pieces: list[int] = tokenizer.encode(marker, add_special_tokens=False)
        assert len(pieces) > 1
        assert ids[marker] not in pieces
        assert tokenizer.decode(pieces) == marker
        assert tokenizer.decode([ids[marker]]) == marker  # a generated marker id still reads as the tag
    assert tokenizer.eos_token_ids == {ids["<|im_end|>"]}
    prompt: str = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_untrained_marker_rule_spares_control_and_trained_tokens() -> None:
    rng = np.random.default_rng(0)
    padding = rng.normal(size=8).astype(np.float32)
    tokens = ["a", "<|ctl|>", "<m1>", "<m2>", "[PAD0]", "[PAD1]"]
    types = [TokenType.NORMAL, TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.USER_DEFINED]
    types += [TokenType.UNUSED, TokenType.UNUSED]
    embeddings = np.stack([rng.normal(size=8), padding, padding, rng.normal(size=8), padding, padding]).astype(
        np.float32
    )
    assert find_untrained_markers(tokens, [int(kind) for kind in types], embeddings) == frozenset({"<m1>"})
    assert find_untrained_markers(tokens[:4], [int(kind) for kind in types[:4]], embeddings[:4]) == frozenset()


def test_unsupported_tokenizer_fails_without_leaving_a_directory(tmp_path: Path, tiny_tokenizer: TinyTokenizer) -> None:
    weights = build_model("qwen2", tiny_tokenizer, seed=2)
    write_gguf(tmp_path / "tiny.gguf", "qwen2", weights, tiny_tokenizer, with_output=True, tokenizer_model="llama")
    models_dir = tmp_path / "models"
    with pytest.raises(ModelLoadError, match="tokenizer model 'llama' is not supported"):
        import_gguf(tmp_path / "tiny.gguf", models_dir / "imported")
    assert list(models_dir.iterdir()) == []


def test_non_gguf_file_is_a_clear_load_error(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelLoadError, match=r"bogus\.gguf"):
        import_gguf(bogus, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_import_keeps_its_gguf_moved_or_recorded_with_each_tensors_bytes(
    tmp_path: Path, tiny_tokenizer: TinyTokenizer
) -> None:
    """A catalog import's scratch GGUF moves into the model directory; a user's file stays where it is, recorded
    by path, size and time (what `--cpu-weights gguf` serves, and what its memory is counted from)."""
    weights = build_model("qwen2", tiny_tokenizer, seed=3)
    source = tmp_path / "tiny.gguf"
    write_gguf(source, "qwen2", weights, tiny_tokenizer, with_output=True)
    tensors = {tensor.name: int(tensor.n_bytes) for tensor in gguf.GGUFReader(source, "r").tensors}
    recorded = import_gguf(source, tmp_path / "recorded")
    assert kept_gguf(recorded) == source.resolve()
    record = read_gguf_source(recorded)
    assert record is not None
    assert record.path == str(source.resolve())
    assert record.tensor_bytes == {hf_tensor_name(name): size for name, size in tensors.items()}
    # Where a runner reads each tensor from without parsing the header again: the bytes gguf's reader gives.
    for tensor in gguf.GGUFReader(source, "r").tensors:
        entry = record.tensors[str(hf_tensor_name(tensor.name))]
        assert (entry.name, entry.type) == (tensor.name, tensor.tensor_type.name)
        read = np.fromfile(source, dtype=np.uint8, count=entry.nbytes, offset=entry.offset)
        np.testing.assert_array_equal(read, np.asarray(tensor.data).view(np.uint8).reshape(-1))
    footprint = read_footprint(recorded)
    assert footprint.total_bytes(weights="gguf") == sum(tensors.values())
    assert footprint.rank_bytes(0, 1, weights="gguf") == sum(
        size for name, size in tensors.items() if not name.startswith("blk.1.")
    )
    assert checkpoint_facts(recorded).gguf_bytes == sum(tensors.values())
    size = source.stat().st_size
    moved = import_gguf(source, tmp_path / "moved", move_gguf=True)
    assert not source.exists()
    assert kept_gguf(moved) == moved / KEPT_GGUF_NAME
    assert (moved / KEPT_GGUF_NAME).stat().st_size == size
    # The user's file is gone from where it was recorded: no GGUF kept for that import any more.
    assert kept_gguf(recorded) is None
