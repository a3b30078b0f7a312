"""Int8 weights inside an mlx model (`--cpu-weights int8`): each product agrees with the float32 one, every matrix of a
real fixture model is converted, and the converted fixture models answer their trained prompts as float32 does.

Tolerance of a product: weights and activations are both rounded per row to 127 levels, so the result stays within
2 % of the output's largest magnitude (the kernel bench measured 1.1-1.5 % on Gaussian data; real weights with a few
large values per row do no worse, since the scale follows each row's largest).
"""

from typing import cast

import mlx.core as mx
import numpy as np
import pytest
from mlx import nn
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.cache.model_identity import model_identity
from exo.worker.engines.mlx.cpu import int8_layers
from exo.worker.engines.mlx.cpu.blas import find_pypi_mkl
from exo.worker.engines.mlx.cpu.engine import CpuKernels
from exo.worker.engines.mlx.cpu.int8_gemm import quantize_weights
from exo.worker.engines.mlx.cpu.int8_layers import (
    Int8Embedding,
    Int8Linear,
    int8_bytes,
    int8_product,
    quantize_model,
)
from exo.worker.engines.mlx.model_loader import load_model as exo_load_model
from tests.fixtures.fixture_specs import (
    FIXTURE_MODEL_NAMES,
    FIXTURE_MODELS_DIR,
    FixtureModelName,
)
from tests.fixtures.model_builder.verify import load_model
from tests.worker.engines.mlx.cpu.weight_formats import TABLES, fixture_matrix, mismatched_trained_cases, relative_error

TOLERANCE = 0.02
pytestmark = pytest.mark.skipif(find_pypi_mkl() is None, reason="the mkl wheel exists only for Linux x86_64")


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 512])
def test_int8_linear_agrees_with_the_float32_product(rows: int) -> None:
    """Row counts of a decode step (1), of batched decoding and draft verification (2-8) and of a prefill chunk."""
    weight = fixture_matrix()
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=True)
    linear.weight = weight
    linear.bias = mx.random.normal((weight.shape[0],), key=mx.random.key(1))
    x = mx.random.normal((1, rows, weight.shape[1]), key=mx.random.key(rows))
    reference = linear(x)
    model = nn.Sequential(linear)
    assert quantize_model(model) == 1
    converted = model.layers[0]
    assert isinstance(converted, Int8Linear)
    result = converted(x)
    assert result.shape == reference.shape
    assert result.dtype == mx.float32
    assert relative_error(result, reference) < TOLERANCE


def test_a_zero_row_of_activations_gives_zeros_and_no_division_by_zero() -> None:
    weight = fixture_matrix()
    x = mx.zeros((2, weight.shape[1]))
    converted = Int8Linear(quantize_weights(np.asarray(weight)), None)
    assert not np.asarray(converted(x)).any()


def test_a_4_bit_quantized_linear_becomes_int8_of_its_dequantized_values() -> None:
    """mlx-community checkpoints hold QuantizedLinear layers: dequantized, then re-quantized to int8 per row."""
    weight = mx.random.normal((96, 128), key=mx.random.key(3))
    quantized = nn.QuantizedLinear.from_linear(_linear(weight), group_size=64, bits=4)
    x = mx.random.normal((4, 128), key=mx.random.key(4))
    reference = quantized(x)
    model = nn.Sequential(quantized)
    assert quantize_model(model) == 1
    assert relative_error(model.layers[0](x), reference) < TOLERANCE


def _linear(weight: mx.array) -> nn.Linear:
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    linear.weight = weight
    return linear


def test_an_int8_embedding_looks_up_dequantized_rows_and_projects_like_the_table() -> None:
    table = mx.random.normal((50, 64), key=mx.random.key(5))
    embedding = nn.Embedding(50, 64)
    embedding.weight = table
    model = nn.Sequential(embedding)
    assert quantize_model(model) == 1
    converted = model.layers[0]
    assert isinstance(converted, Int8Embedding)
    ids = mx.array([[3, 7, 7, 49]])
    looked_up = converted(ids)
    assert looked_up.shape == (1, 4, 64)
    # Each value within half a quantization step of its row (the step is the row's largest magnitude / 127).
    steps = mx.abs(table[ids]).max(axis=-1, keepdims=True) / 127
    assert bool(mx.all(mx.abs(looked_up - table[ids]) <= steps / 2 + 1e-6).item())
    x = mx.random.normal((1, 2, 64), key=mx.random.key(6))
    assert relative_error(converted.as_linear(x), embedding.as_linear(x)) < TOLERANCE


def test_every_matrix_of_a_fixture_model_is_converted_and_logits_stay_close() -> None:
    loaded = load_model(FIXTURE_MODELS_DIR / "tiny-qwen-tools")
    model = loaded.model
    model.set_dtype(mx.float32)
    prompt = mx.array([loaded.tokenizer.encode("What is the weather in Paris?")])
    reference = model(prompt, cache=make_prompt_cache(model))
    float32_bytes = sum(value.nbytes for _, value in cast(list[tuple[str, mx.array]], tree_flatten(model.parameters())))
    converted = quantize_model(model)
    model.set_dtype(mx.float32)
    # 2 layers x 7 projections and the embedding (tied: it is the output projection too).
    assert converted == 15
    assert not [name for name, module in model.named_modules() if isinstance(module, (nn.Linear, nn.Embedding))]
    assert int8_bytes(model) < float32_bytes / 3
    result = model(prompt, cache=make_prompt_cache(model))
    assert relative_error(result, reference) < 0.05
    assert bool(mx.all(result.argmax(-1) == reference.argmax(-1)).item())


@pytest.mark.parametrize("name", list(TABLES))
def test_fixture_models_with_int8_weights_answer_their_trained_prompts_as_trained(name: FixtureModelName) -> None:
    """Loaded the way a runner loads under `--cpu-weights int8`; greedy output (tool calls included) must equal each
    prompt's trained output exactly."""
    assert mismatched_trained_cases(name, "int8") == []


def test_the_weight_format_checks_cover_every_fixture_model() -> None:
    """The int8 and Q8_0 trained-prompt checks run over this table: a fixture model added to the suite joins it."""
    assert sorted(TABLES) == sorted(FIXTURE_MODEL_NAMES)


def test_the_runner_report_names_int8_weights_and_off_keeps_stock_mlx_lm() -> None:
    int8 = CpuKernels("auto", weights="int8")
    states = {state.name: state for state in int8.report().replacements}
    assert states["int8_weights"].on
    assert states["float32"].why_off == "--cpu-weights int8"
    assert int8.report().weights == "int8"
    assert "int8 weights (MKL s8u8s32)" in int8.report().describe()
    float32 = CpuKernels("auto")
    assert {state.name: state.why_off for state in float32.report().replacements}["int8_weights"] == (
        "--cpu-weights float32"
    )
    off = CpuKernels("off", weights="int8")
    loaded = exo_load_model(FIXTURE_MODELS_DIR / "tiny-qwen-tools", ShardAssignment(), cpu_kernels=off)
    assert loaded.dtype == "native"
    assert not [name for name, module in loaded.model.named_modules() if isinstance(module, Int8Linear)]


def test_a_disk_snapshots_model_identity_includes_the_weights_format() -> None:
    """A float32 snapshot is never served to int8 weights (its folder and records carry another identity)."""
    directory = FIXTURE_MODELS_DIR / "tiny-qwen-tools"
    identities = {fmt: model_identity(directory, ShardAssignment(), fmt) for fmt in ("float32", "int8", "native")}
    assert len(set(identities.values())) == 3
    assert model_identity(directory, ShardAssignment(), "int8") == identities["int8"]


def test_int8_product_keeps_leading_dimensions() -> None:
    weight = fixture_matrix()
    x = mx.random.normal((2, 3, weight.shape[1]), key=mx.random.key(9))
    assert int8_product(x, quantize_weights(np.asarray(weight))).shape == (2, 3, weight.shape[0])


def test_a_matrix_converted_in_pieces_equals_one_converted_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Large matrices (the output projection) convert a slice of rows at a time, 4-bit ones included."""
    weight = mx.random.normal((50, 128), key=mx.random.key(10))
    quantized = nn.QuantizedLinear.from_linear(_linear(weight), group_size=64, bits=4)
    whole = int8_layers.int8_from(quantized)
    monkeypatch.setattr(int8_layers, "CONVERSION_ROWS", 7)
    pieces = int8_layers.int8_from(quantized)
    np.testing.assert_array_equal(pieces.values, whole.values)
    np.testing.assert_array_equal(pieces.scales, whole.scales)
    reference = quantize_weights(np.asarray(mx.dequantize(quantized.weight, quantized.scales, quantized.biases, 64, 4)))
    np.testing.assert_array_equal(whole.values, reference.values)
