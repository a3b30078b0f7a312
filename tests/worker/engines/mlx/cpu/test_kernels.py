"""The numpy softmax attention and SwiGLU give mlx's results, and a model routed through them (on a Linux CPU, where
`--cpu-kernels auto` routes it) the same logits; decode steps over a long cache the same greedy tokens."""

from typing import Any, cast

import mlx.core as mx
import pytest
from mlx_lm.models.cache import BatchKVCache, KVCache, make_prompt_cache, trim_prompt_cache

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


@pytest.mark.parametrize("rows", [1, 3])
def test_decode_rows_over_a_cache_match_mlx_across_its_256_token_buffer_boundary(rows: int) -> None:
    """A decode step's few rows (one token, a speculation's verify) against a KVCache's returned slice, grouped
    query heads (14 over 2, the default model's), at contexts on both sides of the cache's 256-token buffer step."""
    mx.random.seed(11)
    cache = KVCache()
    cache.update_and_fetch(mx.random.normal((1, 2, 250, 64)), mx.random.normal((1, 2, 250, 64)))
    mask = "causal" if rows > 1 else None
    for _ in range(8):
        fetched = cache.update_and_fetch(mx.random.normal((1, 2, rows, 64)), mx.random.normal((1, 2, rows, 64)))
        keys, values = cast(tuple[mx.array, mx.array], fetched)
        queries = mx.random.normal((1, 14, rows, 64)) * 2
        expected = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=0.125, mask=mask)
        got = numpy_softmax_attention(queries, keys, values, 0.125, causal=mask is not None)
        assert mx.allclose(got, expected, atol=1e-5, rtol=1e-4).item()
    assert cache.offset == 250 + 8 * rows > 256


def test_a_boolean_padding_mask_matches_mlx() -> None:
    mx.random.seed(5)
    queries, keys, values = (
        mx.random.normal((2, 8, 2, 32)),
        mx.random.normal((2, 2, 300, 32)),
        mx.random.normal((2, 2, 300, 32)),
    )
    allowed = mx.broadcast_to(mx.arange(300) >= mx.array([0, 40])[:, None, None, None], (2, 1, 2, 300))
    expected = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=0.2, mask=allowed)
    got = numpy_softmax_attention(queries, keys, values, 0.2, causal=False, allowed=allowed)
    assert mx.allclose(got, expected, atol=1e-5, rtol=1e-4).item()


def test_decode_steps_go_to_numpy_from_the_decode_context_on(monkeypatch: pytest.MonkeyPatch) -> None:
    routed: list[int] = []
    monkeypatch.setattr(cpu_kernels, "numpy_softmax_attention", lambda q, k, *_, **__: routed.append(k.shape[2]) or q)
    threshold = cpu_kernels.MIN_DECODE_CONTEXT
    rows = mx.ones((1, 14, cpu_kernels.DECODE_ROWS, 64))
    for context in (threshold - 1, threshold, 8000):
        keys = mx.ones((1, 2, context, 64))
        scaled_dot_product_attention(rows[:, :, :1], keys, keys, None, 0.125, None)  # one token
        scaled_dot_product_attention(rows, keys, keys, None, 0.125, "causal")  # a verify's rows
    assert routed == [threshold, threshold, 8000, 8000]
    keys = mx.ones((1, 2, 8000, 64))
    padded = mx.ones((1, 1, 1, 8000), dtype=mx.bool_)  # a left-padded batch's mask
    scaled_dot_product_attention(rows[:, :, :1], keys, keys, None, 0.125, padded)
    assert routed == [threshold, threshold, 8000, 8000, 8000]
    additive = mx.zeros((1, 1, 1, 8000))  # additive masks: mlx's
    scaled_dot_product_attention(rows[:, :, :1], keys, keys, None, 0.125, additive)
    more_rows = mx.ones((1, 14, cpu_kernels.DECODE_ROWS + 1, 64))  # a small chunk: below MIN_SCORES, mlx's
    scaled_dot_product_attention(more_rows, keys[:, :, :300], keys[:, :, :300], None, 0.125, "causal")
    prefill_mask = mx.ones((32, 300), dtype=mx.bool_)  # a prefill chunk's array mask: mlx's, as before
    scaled_dot_product_attention(
        mx.ones((1, 14, 32, 64)), keys[:, :, :300], keys[:, :, :300], None, 0.125, prefill_mask
    )
    assert routed == [threshold, threshold, 8000, 8000, 8000]


def _greedy(model: Any, prompt: list[int], steps: int, cache: list[Any]) -> list[int]:
    logits = model(mx.array([prompt]), cache=cache)
    tokens: list[int] = []
    for _ in range(steps):
        token = cast(int, mx.argmax(logits[0, -1]).item())
        tokens.append(token)
        logits = model(mx.array([[token]]), cache=cache)
    return tokens


@pytest.mark.usefixtures("linux_cpu_machine")
def test_greedy_decoding_through_the_numpy_decode_path_is_mlx_lms(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every decode step through the numpy path (the threshold lowered to 1) gives stock mlx-lm's greedy tokens, on
    a fresh cache crossing its 256-token buffer step, on one trimmed back as the prefix cache reuses it, and a
    speculation's multi-token verify gives the same logits."""
    loaded = load_model(fixture_model("tiny-qwen-tools"), ShardAssignment(rank=0, world_size=1))
    model = loaded.model
    module = __import__(type(model).__module__, fromlist=["scaled_dot_product_attention"])
    prompt = [(index * 37) % 200 + 5 for index in range(240)]
    routed: list[int] = []
    numpy_attention = cpu_kernels.numpy_softmax_attention

    def counted(queries: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        routed.append(queries.shape[2])
        return numpy_attention(queries, *args, **kwargs)

    def run() -> tuple[list[int], list[int], mx.array]:
        cache = make_prompt_cache(model)
        fresh = _greedy(model, prompt, 30, cache)  # 240 → 270 cached tokens
        trim_prompt_cache(cache, 40)  # the prefix cache's trim: back to 230, then on again
        trimmed = _greedy(model, [7, 9], 20, cache)
        verify = model(mx.array([fresh[:4]]), cache=cache)  # four rows at once, causal over the cache
        return fresh, trimmed, verify

    monkeypatch.setattr(cpu_kernels, "numpy_softmax_attention", counted)
    monkeypatch.setattr(cpu_kernels, "MIN_DECODE_CONTEXT", 1)
    with_numpy = run()
    assert 1 in routed
    assert 4 in routed
    monkeypatch.setattr(module, "scaled_dot_product_attention", cpu_kernels.MLX_ATTENTION)
    with_mlx = run()
    assert with_numpy[:2] == with_mlx[:2]
    assert mx.allclose(with_numpy[2], with_mlx[2], atol=1e-4, rtol=1e-4).item()


@pytest.mark.usefixtures("linux_cpu_machine")
def test_a_left_padded_batch_decodes_through_numpy_as_through_mlx(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batched decode (mlx-lm's BatchKVCache: members merged left-padded, a boolean mask) gives mlx-lm's greedy
    tokens through the numpy path, before and after a member leaves (`filter`) and another joins (`extend`)."""
    model = load_model(fixture_model("tiny-qwen-tools"), ShardAssignment(rank=0, world_size=1)).model
    module = __import__(type(model).__module__, fromlist=["scaled_dot_product_attention"])
    routed: list[int] = []
    numpy_attention = cpu_kernels.numpy_softmax_attention

    def counted(queries: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        routed.append(queries.shape[0])
        return numpy_attention(queries, *args, **kwargs)

    def prefilled(length: int, seed: int) -> list[Any]:
        cache = make_prompt_cache(model)
        mx.eval(model(mx.array([[(index * seed) % 200 + 5 for index in range(length)]]), cache=cache))
        return cache

    def steps(cache: list[Any], tokens: mx.array, count: int) -> tuple[list[list[int]], mx.array]:
        out: list[list[int]] = []
        for _ in range(count):
            tokens = mx.argmax(model(tokens, cache=cache)[:, -1:], axis=-1)
            out.append(cast(list[int], tokens[:, 0].tolist()))
        return out, tokens

    def run() -> list[list[int]]:
        members = [prefilled(260, 37), prefilled(230, 11)]
        batch = [BatchKVCache.merge([c[layer] for c in members]) for layer in range(len(members[0]))]
        together, tokens = steps(batch, mx.array([[5], [9]]), 12)
        for layer in batch:  # the first member leaves
            layer.filter(mx.array([1]))
        alone, tokens = steps(batch, tokens[1:], 6)
        newcomer = [BatchKVCache.merge([c]) for c in prefilled(250, 5)]
        for layer, joining in zip(batch, newcomer, strict=True):  # another joins
            layer.extend(joining)
        joined, _ = steps(batch, mx.concatenate([tokens, mx.array([[3]])]), 8)
        return together + alone + joined

    monkeypatch.setattr(cpu_kernels, "numpy_softmax_attention", counted)
    monkeypatch.setattr(cpu_kernels, "MIN_DECODE_CONTEXT", 1)
    with_numpy = run()
    assert set(routed) == {1, 2}
    monkeypatch.setattr(module, "scaled_dot_product_attention", cpu_kernels.MLX_ATTENTION)
    assert run() == with_numpy
