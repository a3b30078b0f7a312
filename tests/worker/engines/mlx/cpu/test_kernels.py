"""The numpy softmax attention and SwiGLU give mlx's results, and a model routed through them (on a Linux CPU, where
`--cpu-kernels auto` routes it) the same logits."""

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.cpu import kernels as cpu_kernels
from exo.worker.engines.mlx.cpu.kernels import numpy_softmax_attention, scaled_dot_product_attention, swiglu
from exo.worker.engines.mlx.model_loader import load_model
from tests.exo_server import fixture_model


@pytest.mark.parametrize(
    ("shape", "causal"),
    [
        ((1, 14, 2, 64, 64), True),  # a first chunk: the whole context is the chunk
        ((1, 14, 2, 48, 300), True),  # a later chunk after cached context
        ((2, 4, 4, 16, 40), True),  # a batch, no grouping
        ((1, 8, 2, 1, 90), True),  # one query row: nothing to mask
        ((1, 6, 3, 20, 20), False),
    ],
)
def test_it_matches_mlx_attention(shape: tuple[int, int, int, int, int], causal: bool) -> None:
    batch, query_heads, kv_heads, length, context = shape
    mx.random.seed(7)
    queries = mx.random.normal((batch, query_heads, length, 32)) * 3
    keys = mx.random.normal((batch, kv_heads, context, 32)) * 3
    values = mx.random.normal((batch, kv_heads, context, 32))
    mask = "causal" if causal else None
    expected = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=0.17, mask=mask)
    got = numpy_softmax_attention(queries, keys, values, 0.17, causal=causal)
    assert got.shape == expected.shape
    assert mx.allclose(got, expected, atol=1e-5, rtol=1e-4).item()


def test_calls_it_does_not_cover_go_to_mlx_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_kernels, "MIN_SCORES", 1)
    queries, keys, values = mx.ones((1, 2, 4, 8)), mx.ones((1, 2, 4, 8)), mx.ones((1, 2, 4, 8))
    routed: list[str] = []
    monkeypatch.setattr(cpu_kernels, "numpy_softmax_attention", lambda *_, **__: routed.append("numpy") or queries)
    scaled_dot_product_attention(queries, keys, values, None, 1.0, "causal")
    assert routed == ["numpy"]
    array_mask = mx.ones((4, 4), dtype=mx.bool_)
    scaled_dot_product_attention(queries, keys, values, None, 1.0, array_mask)  # an array mask
    scaled_dot_product_attention(queries[:, :, :1], keys, values, None, 1.0, None)  # a decode step
    scaled_dot_product_attention(queries.astype(mx.float16), keys, values, None, 1.0, "causal")  # not float32
    assert routed == ["numpy"]
    monkeypatch.setattr(cpu_kernels, "MIN_SCORES", 1 << 30)
    scaled_dot_product_attention(queries, keys, values, None, 1.0, "causal")  # too few scores to pay
    assert routed == ["numpy"]


def test_swiglu_matches_mlx_including_very_negative_gates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_kernels, "MIN_GATE_VALUES", 1)
    mx.random.seed(3)
    gate = mx.concatenate([mx.random.normal((1, 40, 64)) * 4, mx.full((1, 1, 64), -200.0)], axis=1)
    up = mx.random.normal((1, 41, 64))
    got = swiglu(gate, up)
    assert mx.allclose(got, cpu_kernels.MLX_SWIGLU(gate, up), atol=1e-6, rtol=1e-5).item()
    assert (got[0, -1] == 0).all().item()
    assert swiglu(gate[0, 0], up[0, 0]).shape == (64,)


@pytest.mark.usefixtures("linux_cpu_machine")
def test_a_loaded_model_is_routed_through_them_and_its_logits_do_not_change(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = load_model(fixture_model("tiny-qwen-tools"), ShardAssignment(rank=0, world_size=1))
    module = __import__(type(loaded.model).__module__, fromlist=["scaled_dot_product_attention"])
    assert module.scaled_dot_product_attention is scaled_dot_product_attention
    assert module.swiglu is swiglu
    tokens = mx.array([[(index * 37) % 200 + 5 for index in range(96)]])
    monkeypatch.setattr(cpu_kernels, "MIN_SCORES", 1)
    monkeypatch.setattr(cpu_kernels, "MIN_GATE_VALUES", 1)
    with_numpy = loaded.model(tokens, cache=make_prompt_cache(loaded.model))
    monkeypatch.setattr(module, "scaled_dot_product_attention", cpu_kernels.MLX_ATTENTION)
    monkeypatch.setattr(module, "swiglu", cpu_kernels.MLX_SWIGLU)
    with_mlx = loaded.model(tokens, cache=make_prompt_cache(loaded.model))
    assert mx.allclose(with_numpy, with_mlx, atol=1e-4, rtol=1e-4).item()
    assert (mx.argmax(with_numpy, axis=-1) == mx.argmax(with_mlx, axis=-1)).all().item()
