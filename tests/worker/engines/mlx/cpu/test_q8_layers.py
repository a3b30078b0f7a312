"""Q8_0 weights inside an mlx model (`--cpu-weights q8_0`): each ggml product agrees with the float32 one, an
embedding lookup reads its blocks back, every matrix of a real fixture model is held at 34 bytes per 32 weights, and
the converted fixture models answer their trained prompts as float32 does.

Tolerance of a product: the weights are rounded per block of 32 to 255 levels around a float16 scale, and ggml rounds
the activations the same way before its integer dot products, so the result stays within 2 % of the output's largest
magnitude (the kernel bench measured 0.7-0.9 % on Gaussian data; a block's scale follows its own largest value, so
real weights with a few large values do no worse).

These tests need ggml's CPU library (`uv run exo ggml build`, or EXO_GGML_DIR): without it they skip for a reason of
the machine, a failure under EXO_STRICT_SKIPS=1 (CI builds the library first).
"""

from pathlib import Path
from typing import cast

import mlx.core as mx
import numpy as np
import pytest
from mlx import nn
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

from exo.models.errors import ModelLoadError
from exo.shared.types.footprint import Q8_0_BYTES_PER_WEIGHT, held_bytes
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.cache.model_identity import model_identity
from exo.worker.engines.mlx.cpu import q8_layers
from exo.worker.engines.mlx.cpu.engine import CpuKernels
from exo.worker.engines.mlx.cpu.engine import held_bytes as loaded_held_bytes
from exo.worker.engines.mlx.cpu.ggml_library import CACHED_ROWS, Ggml, q8_0_to_float32
from exo.worker.engines.mlx.cpu.q8_layers import Q8Embedding, Q8Linear, q8_bytes, quantize_model_q8
from exo.worker.engines.mlx.model_loader import load_model as exo_load_model
from tests.fixtures.fixture_specs import (
    FIXTURE_MODELS_DIR,
    FixtureModelName,
)
from tests.fixtures.model_builder.verify import load_model
from tests.worker.engines.mlx.cpu.platform_gate import require_linux_cpu
from tests.worker.engines.mlx.cpu.weight_formats import TABLES, fixture_matrix, mismatched_trained_cases, relative_error

TOLERANCE = 0.02


def _linear(weight: mx.array, bias: bool = False) -> nn.Linear:
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias)
    linear.weight = weight
    return linear


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, CACHED_ROWS, CACHED_ROWS + 1, 512])
def test_q8_linear_agrees_with_the_float32_product(ggml: Ggml, rows: int) -> None:
    """Row counts of a decode step (1), of batched decoding and draft verification (2-16, whose graphs are kept) and
    of prefill chunks (a graph built per call)."""
    weight = fixture_matrix()
    linear = _linear(weight, bias=True)
    linear.bias = mx.random.normal((weight.shape[0],), key=mx.random.key(1))
    x = mx.random.normal((1, rows, weight.shape[1]), key=mx.random.key(rows))
    reference = linear(x)
    model = nn.Sequential(linear)
    assert quantize_model_q8(model, ggml) == 1
    converted = model.layers[0]
    assert isinstance(converted, Q8Linear)
    result = converted(x)
    assert result.shape == reference.shape
    assert result.dtype == mx.float32
    assert relative_error(result, reference) < TOLERANCE
    # A kept graph gives the same result again; another row count in between does not disturb it.
    converted(x[:, :1])
    assert bool(mx.array_equal(converted(x), result).item())


def test_a_4_bit_quantized_linear_becomes_q8_0_of_its_dequantized_values(ggml: Ggml) -> None:
    """mlx-community checkpoints hold QuantizedLinear layers: dequantized a slice at a time, then Q8_0."""
    weight = mx.random.normal((96, 128), key=mx.random.key(3))
    quantized = nn.QuantizedLinear.from_linear(_linear(weight), group_size=64, bits=4)
    x = mx.random.normal((4, 128), key=mx.random.key(4))
    reference = quantized(x)
    model = nn.Sequential(quantized)
    assert quantize_model_q8(model, ggml) == 1
    assert isinstance(model.layers[0], Q8Linear)
    assert relative_error(model.layers[0](x), reference) < TOLERANCE


def test_a_q8_0_embedding_looks_up_its_blocks_and_projects_like_the_table(ggml: Ggml) -> None:
    table = mx.random.normal((50, 64), key=mx.random.key(5))
    embedding = nn.Embedding(50, 64)
    embedding.weight = table
    model = nn.Sequential(embedding)
    assert quantize_model_q8(model, ggml) == 1
    converted = model.layers[0]
    assert isinstance(converted, Q8Embedding)
    ids = mx.array([[3, 7, 7, 49]])
    looked_up = converted(ids)
    assert looked_up.shape == (1, 4, 64)
    expected = np.asarray(table[ids])
    # Each value within half a step of its block (the step is the block's largest magnitude / 127), plus the float16
    # rounding of the block's scale.
    blocks = np.abs(expected).reshape(1, 4, 2, 32).max(axis=-1, keepdims=True)
    bound = np.broadcast_to(blocks / 127 * (0.5 + 127 / 2048), (1, 4, 2, 32)).reshape(1, 4, 64)
    assert (np.abs(np.asarray(looked_up) - expected) <= bound + 1e-6).all()
    # The lookup reads exactly what the products multiply by.
    stored = q8_0_to_float32(converted.q8.matrix.blocks)
    np.testing.assert_array_equal(np.asarray(looked_up)[0], stored[[3, 7, 7, 49]])
    x = mx.random.normal((1, 2, 64), key=mx.random.key(6))
    assert relative_error(converted.as_linear(x), embedding.as_linear(x)) < TOLERANCE


def test_a_matrix_converted_in_pieces_equals_one_converted_whole(ggml: Ggml, monkeypatch: pytest.MonkeyPatch) -> None:
    """Large matrices (the output projection) convert a slice of rows at a time, 4-bit ones included."""
    weight = mx.random.normal((50, 128), key=mx.random.key(10))
    quantized = nn.QuantizedLinear.from_linear(_linear(weight), group_size=64, bits=4)
    whole = q8_layers.q8_from(quantized, ggml)
    monkeypatch.setattr(q8_layers, "CONVERSION_ROWS", 7)
    pieces = q8_layers.q8_from(quantized, ggml)
    np.testing.assert_array_equal(pieces.matrix.blocks, whole.matrix.blocks)
    dequantized = np.asarray(mx.dequantize(quantized.weight, quantized.scales, quantized.biases, 64, 4))
    assert np.abs(q8_0_to_float32(whole.matrix.blocks) - dequantized).max() <= np.abs(dequantized).max() / 127


def test_every_matrix_of_a_fixture_model_is_held_at_34_bytes_per_32_weights(ggml: Ggml) -> None:
    loaded = load_model(FIXTURE_MODELS_DIR / "tiny-qwen-tools")
    model = loaded.model
    model.set_dtype(mx.float32)
    prompt = mx.array([loaded.tokenizer.encode("What is the weather in Paris?")])
    reference = model(prompt, cache=make_prompt_cache(model))
    parameters = cast(list[tuple[str, mx.array]], tree_flatten(model.parameters()))
    matrices = sum(value.size for _, value in parameters if value.ndim == 2)
    everything = sum(value.size for _, value in parameters)
    converted = quantize_model_q8(model, ggml)
    model.set_dtype(mx.float32)
    # 2 layers x 7 projections and the embedding (tied: it is the output projection too).
    assert converted == 15
    assert not [name for name, module in model.named_modules() if isinstance(module, (nn.Linear, nn.Embedding))]
    assert q8_bytes(model) == matrices * 34 // 32
    # What footprint plans (34/32 a parameter) against what the model holds (norms and biases in float32 besides).
    planned = held_bytes(everything, 0, weights="q8_0")
    assert planned == int(everything * Q8_0_BYTES_PER_WEIGHT)
    assert abs(loaded_held_bytes(model) - planned) / planned < 0.02
    result = model(prompt, cache=make_prompt_cache(model))
    assert relative_error(result, reference) < 0.05
    assert bool(mx.all(result.argmax(-1) == reference.argmax(-1)).item())


@pytest.mark.usefixtures("ggml")
@pytest.mark.parametrize("name", list(TABLES))
def test_fixture_models_with_q8_0_weights_answer_their_trained_prompts_as_trained(name: FixtureModelName) -> None:
    """Loaded the way a runner loads under `--cpu-weights q8_0`; greedy output (tool calls included) must equal each
    prompt's trained output exactly."""
    require_linux_cpu()
    assert mismatched_trained_cases(name, "q8_0") == []


def test_the_runner_report_names_q8_0_weights(ggml: Ggml) -> None:
    require_linux_cpu()
    q8 = CpuKernels("auto", weights="q8_0")
    states = {state.name: state for state in q8.report().replacements}
    assert states["q8_0_weights"].on
    assert states["float32"].why_off == "--cpu-weights q8_0"
    assert states["int8_weights"].why_off == "--cpu-weights q8_0"
    assert q8.report().weights == "q8_0"
    assert "Q8_0 weights (ggml)" in q8.report().describe()
    assert q8.ggml_dir == ggml.library_dir
    float32 = CpuKernels("auto")
    assert {state.name: state.why_off for state in float32.report().replacements}["q8_0_weights"] == (
        "--cpu-weights float32"
    )
    off = CpuKernels("off", weights="q8_0")
    loaded = exo_load_model(FIXTURE_MODELS_DIR / "tiny-qwen-tools", ShardAssignment(), cpu_kernels=off)
    assert loaded.dtype == "native"
    assert not [name for name, module in loaded.model.named_modules() if isinstance(module, Q8Linear)]


def test_without_the_ggml_library_q8_0_refuses_to_load_naming_the_build_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Not served as float32 instead: the node planned memory for Q8_0, and float32 takes four times as much."""
    require_linux_cpu()
    monkeypatch.setenv("EXO_GGML_DIR", str(tmp_path))  # a folder without the libraries
    kernels = CpuKernels("auto", weights="q8_0")
    assert {state.name: state.why_off for state in kernels.report().replacements}["q8_0_weights"] == ("no ggml library")
    with pytest.raises(ModelLoadError, match=r"--cpu-weights q8_0 needs ggml's CPU library.*exo ggml build"):
        exo_load_model(FIXTURE_MODELS_DIR / "tiny-qwen-tools", ShardAssignment(), cpu_kernels=kernels)


def test_a_disk_snapshots_model_identity_includes_the_q8_0_format() -> None:
    """A float32 or int8 snapshot is never served to Q8_0 weights (its folder and records carry another identity)."""
    directory = FIXTURE_MODELS_DIR / "tiny-qwen-tools"
    formats = ("float32", "int8", "q8_0", "native")
    identities = {fmt: model_identity(directory, ShardAssignment(), fmt) for fmt in formats}
    assert len(set(identities.values())) == len(formats)
