"""A decode step's attention part alone, over a long cache (issue 33): for each `--context`, 24 layers of the default
model's attention shapes (14 query heads over 2 KV heads, head dim 64), each layer the cache update (mlx-lm's
KVCache, or a BatchKVCache of two left-padded members) and the attention of one new row, one `mx.eval` per layer as
the runner's next product forces it. mlx-lm's attention (`mx.fast.scaled_dot_product_attention`) against the engine's
(`kernels.scaled_dot_product_attention`: the numpy softmax from `MIN_DECODE_CONTEXT` cached tokens on), taking turns
in every round (the other order every other round), under the runner's BLAS environment (MKL on one thread). Also
times each piece of one layer's attention alone. Not a test; the model's weights are not involved.

`uv run python -m bench.decode_attention [--context 100,2000,8000] [--rounds 9]`
"""

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any, cast

from bench.machine import run_bench_worker

LAYERS, QUERY_HEADS, KV_HEADS, HEAD_DIM = 24, 14, 2, 64


def _worker(contexts: list[int], rounds: int) -> None:
    import mlx.core as mx
    import numpy as np
    from mlx_lm.models.cache import BatchKVCache, KVCache

    from exo.worker.engines.mlx.cpu import kernels
    from exo.worker.engines.mlx.cpu.blas_check import set_blas_threads

    set_blas_threads(1)
    scale = HEAD_DIM**-0.5

    def filled(length: int) -> Any:
        cache = KVCache()
        shape = (1, KV_HEADS, length, HEAD_DIM)
        cache.update_and_fetch(mx.random.normal(shape), mx.random.normal(shape))
        return cache

    def caches(context: int, batch: int) -> list[Any]:
        found: list[Any] = []
        for _ in range(LAYERS):
            if batch == 1:
                cache = filled(context)
            else:
                cache = BatchKVCache.merge([filled(context - 37 * member) for member in range(batch)])
            mx.eval(cache.keys, cache.values)
            found.append(cache)
        return found

    def step(layers: list[Any], attention: Callable[..., mx.array], batch: int, seed: int) -> float:
        mx.random.seed(seed)
        queries = mx.random.normal((batch, QUERY_HEADS, 1, HEAD_DIM))
        new = mx.random.normal((batch, KV_HEADS, 1, HEAD_DIM))
        mx.eval(queries, new)
        started = time.perf_counter()
        for cache in layers:
            mask = cache.make_mask(1) if batch > 1 else None
            keys, values = cache.update_and_fetch(new, new)
            mx.eval(attention(queries, keys, values, cache, scale, mask))
        elapsed = (time.perf_counter() - started) * 1000
        for cache in layers:
            cache.trim(1)
        return elapsed

    def timed(function: Callable[[], object], repeats: int = 30) -> float:
        function()
        times: list[float] = []
        for _ in range(repeats):
            started = time.perf_counter()
            function()
            times.append(time.perf_counter() - started)
        return statistics.median(times) * 1000

    def pieces(context: int) -> list[tuple[str, float]]:
        """One layer's attention and its parts alone (one row, contiguous keys), each evaluated by itself."""
        keys = mx.random.normal((1, KV_HEADS, context, HEAD_DIM))
        queries = mx.random.normal((1, KV_HEADS, QUERY_HEADS // KV_HEADS, HEAD_DIM))
        scores = queries @ keys.swapaxes(-1, -2)
        mx.eval(keys, queries, scores)
        rows = queries.reshape(1, QUERY_HEADS, 1, HEAD_DIM)
        view = np.asarray(scores)
        return [
            ("mlx sdpa", timed(lambda: mx.eval(mx.fast.scaled_dot_product_attention(rows, keys, keys, scale=scale)))),
            ("mlx scores matmul", timed(lambda: mx.eval(queries @ keys.swapaxes(-1, -2)))),
            ("mlx softmax (precise)", timed(lambda: mx.eval(mx.softmax(scores, axis=-1, precise=True)))),
            ("numpy softmax", timed(lambda: np.exp(view - view.max(axis=-1, keepdims=True)))),
            ("mlx output matmul", timed(lambda: mx.eval(scores @ keys))),
        ]

    attentions: dict[str, Callable[..., mx.array]] = {
        "mlx-lm": kernels.MLX_ATTENTION,
        "engine": kernels.scaled_dot_product_attention,
    }
    print(f"load average at the start {_load()}")
    for context in contexts:
        for batch in (1, 2):
            layers = caches(context, batch)
            results: dict[str, list[float]] = {name: [] for name in attentions}
            for round_number in range(rounds):
                names = list(attentions) if round_number % 2 == 0 else list(attentions)[::-1]
                for name in names:
                    results[name].append(step(layers, attentions[name], batch, round_number))
            medians = ", ".join(f"{name} {statistics.median(times):.2f} ms" for name, times in results.items())
            print(f"context {context}, batch {batch}: 24 layers' update + attention, median: {medians}")
        print(f"context {context}, one layer's pieces: " + ", ".join(f"{k} {v:.3f} ms" for k, v in pieces(context)))
    print(f"load average at the end {_load()}")


def _load() -> str:
    with open("/proc/loadavg") as file:
        return " ".join(file.read().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description="a decode step's attention over a long cache, mlx-lm's and exo's")
    parser.add_argument("--context", default="100,2000,8000")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    contexts = [int(value) for value in cast(str, arguments.context).split(",")]
    if arguments.worker:
        _worker(contexts, cast(int, arguments.rounds))
        return
    run = run_bench_worker("bench.decode_attention")
    print(run.header)
    print(run.stdout)


if __name__ == "__main__":
    main()
