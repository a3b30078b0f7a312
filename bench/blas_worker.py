"""One BLAS candidate measured in its own process: `python -m bench.blas_worker SETUP_JSON`, one JSON line out.

The parent starts it with the candidate's environment (``LD_PRELOAD`` and friends), because a BLAS must be in place
before mlx is imported. It reports which library ``cblas_sgemm`` resolved to (so a preload that did not take is
seen), the runner's own matmul self-check, a sustained matmul rate, and prefill/decode speed on a real model
loaded as exo's runner loads it (float32 on a Linux CPU).
"""

import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache
from pydantic import BaseModel

from bench.results import BlasMeasurement
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.cpu.blas_check import SELF_CHECK_SIZE, cblas_provider, measure_matmul_gflops
from exo.worker.engines.mlx.model_loader import load_model

_PROMPT_TEXT = "def fibonacci(n):\n    " * 400


class BlasWorkerSetup(BaseModel):
    model_path: Path | None
    prefill_tokens: int
    decode_tokens: int
    sustained_seconds: float


def sustained_matmul_gflops(seconds: float, n: int = SELF_CHECK_SIZE) -> float:
    """Mean float32 matmul throughput over `seconds`: what a long prefill sees, stalls included."""
    left = mx.random.normal((n, n), key=mx.random.key(0))
    right = mx.random.normal((n, n), key=mx.random.key(1))
    mx.eval(left, right, left @ right)
    runs = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        mx.eval(left @ right)
        runs += 1
    return 2 * n**3 * runs / (time.perf_counter() - started) / 1e9


def model_speeds(model_path: Path, prefill_tokens: int, decode_tokens: int) -> tuple[float, float]:
    """Prefill and greedy decode tokens/s of the model at `model_path`, loaded as exo's runner loads it."""
    loaded = load_model(model_path, ShardAssignment())
    prompt = loaded.tokenizer.encode(_PROMPT_TEXT)[:prefill_tokens]
    model = loaded.model
    mx.eval(model(mx.array([prompt[:8]]), cache=make_prompt_cache(model)))  # warm-up
    cache = make_prompt_cache(model)
    started = time.perf_counter()
    logits = model(mx.array([prompt]), cache=cache)
    mx.eval(logits)
    prefill = len(prompt) / (time.perf_counter() - started)
    started = time.perf_counter()
    for _ in range(decode_tokens):
        logits = model(mx.argmax(logits[:, -1, :], axis=-1)[:, None], cache=cache)
        mx.eval(logits)
    decode = decode_tokens / (time.perf_counter() - started)
    return prefill, decode


def main() -> None:
    setup = BlasWorkerSetup.model_validate_json(sys.argv[1])
    library = cblas_provider()
    self_check = measure_matmul_gflops()
    sustained = sustained_matmul_gflops(setup.sustained_seconds)
    prefill = decode = None
    if setup.model_path is not None:
        prefill, decode = model_speeds(setup.model_path, setup.prefill_tokens, setup.decode_tokens)
    measurement = BlasMeasurement(
        library=str(library) if library else None,
        self_check_gflops=self_check,
        sustained_gflops=sustained,
        prefill_tokens_per_s=prefill,
        decode_tokens_per_s=decode,
    )
    print(measurement.model_dump_json(), flush=True)


if __name__ == "__main__":
    main()
