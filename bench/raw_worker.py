"""The raw mlx-lm baseline as its own process: `python -m bench.raw_worker SETUP_JSON`, then one request per line.

The parent starts it with the environment exo gives its runner (`blas_environment`), because the optimized BLAS
must be preloaded before mlx is imported. The model is loaded exactly as exo's runner loads it (float32 on a
Linux CPU) and generation is a bare `mlx_lm.stream_generate` loop. Before answering requests the same float32
weights are saved to a directory so mlx_lm.server can serve the very same numbers (it would otherwise load the
float16 checkpoint, which skips BLAS on x86 and is many times slower: not a fair peer).

Protocol: after setup one `RawReady` JSON line on stdout; then for each `RawRequest` line on stdin one
`StreamMeasurement` line, and for each `PassCostRequest` line one `PassCosts` line (timed on a second, planned copy
of the model when the request says so); stdin closing ends the process.
Staying alive lets the parent interleave raw runs with exo and mlx_lm.server runs, so load from other processes hits
every system alike.
"""

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Annotated, Literal, cast

import mlx.core as mx
from mlx_lm.generate import stream_generate
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import make_sampler
from mlx_lm.utils import save_model
from pydantic import BaseModel, Field, TypeAdapter

from bench.results import StreamMeasurement
from bench.workloads import decode_messages
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.cache.layer_cache import PromptCache, trim_tokens
from exo.worker.engines.mlx.cpu.blas_check import measure_matmul_gflops
from exo.worker.engines.mlx.cpu.matmul_planner import MatmulPlanner
from exo.worker.engines.mlx.utils_mlx import LoadedModel, load_model

_WEIGHT_SUFFIXES = (".safetensors", ".safetensors.index.json")
WARM_UP_MAX_TOKENS = 4


class RawSetup(BaseModel):
    model_path: Path
    float32_copy: Path


class RawReady(BaseModel):
    dtype: str
    matmul_gflops: float
    """Float32 matmul speed under this process's BLAS: shows whether the preload took effect."""


class RawRequest(BaseModel):
    kind: Literal["generate"] = "generate"
    tag: str
    max_tokens: int


class PassCostRequest(BaseModel):
    """Time one decode step (a forward pass and the greedy pick) over each number of sequences in `rows`."""

    kind: Literal["pass_costs"] = "pass_costs"
    rows: list[int]
    repeats: int
    planned: bool = False
    """Time the steps on a second copy of the model with exo's matmul plan installed, as exo's runner has it."""


class PassCosts(BaseModel):
    seconds: dict[int, float]
    """Best time of a decode step over that many sequences, each one token past the decode prompt."""


_REQUESTS: TypeAdapter[RawRequest | PassCostRequest] = TypeAdapter(
    Annotated[RawRequest | PassCostRequest, Field(discriminator="kind")]
)


def _prompt_tokens(loaded: LoadedModel, tag: str) -> list[int]:
    messages = [message.model_dump(exclude_none=True) for message in decode_messages(tag)]
    return cast(list[int], loaded.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))


def measure_once(loaded: LoadedModel, prompt: list[int], max_tokens: int) -> StreamMeasurement:
    """One greedy generation, timed like a client times a stream: first token, then the rest."""
    started = time.perf_counter()
    first_at: float | None = None
    tokens = 0
    pieces: list[str] = []
    for response in stream_generate(
        loaded.model, loaded.tokenizer, mx.array(prompt), max_tokens=max_tokens, sampler=make_sampler(temp=0.0)
    ):
        if first_at is None:
            first_at = time.perf_counter()
        tokens += 1
        pieces.append(response.text)
    finished = time.perf_counter()
    return StreamMeasurement(
        ttft_s=(first_at or finished) - started,
        total_s=finished - started,
        completion_tokens=tokens,
        prompt_tokens=len(prompt),
        cached_tokens=0,
        text="".join(pieces),
    )


def measure_pass_costs(loaded: LoadedModel, prompt: list[int], request: PassCostRequest) -> PassCosts:
    """What batching can gain here: a decode step over N sequences against one over a single sequence.

    Each batch size gets its own cache holding the prompt N times; every step feeds one token per sequence and is
    then taken back out of the cache, so all steps see the same context. The sizes take turns, repeat by repeat,
    so load from elsewhere falls on all of them; the first round only warms up.
    """
    caches: dict[int, PromptCache] = {}
    for rows in request.rows:
        cache: PromptCache = make_prompt_cache(loaded.model)
        mx.eval(loaded.model(mx.array([prompt] * rows), cache=cache))
        caches[rows] = cache
    best: dict[int, float] = {}
    for repeat in range(request.repeats + 1):
        for rows, cache in caches.items():
            started = time.perf_counter()
            logits = loaded.model(mx.array([prompt[-1:]] * rows), cache=cache)
            mx.eval(mx.argmax(logits[:, -1, :], axis=-1))
            elapsed = time.perf_counter() - started
            trim_tokens(cache, 1)
            if repeat > 0:
                best[rows] = min(best.get(rows, elapsed), elapsed)
    return PassCosts(seconds=best)


def save_float32_copy(loaded: LoadedModel, source: Path, destination: Path) -> None:
    """Write the loaded (float32) weights next to the source's config and tokenizer files."""
    destination.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.is_file() and not item.name.endswith(_WEIGHT_SUFFIXES):
            shutil.copy2(item, destination / item.name)
    save_model(destination, loaded.model)
    config_path = destination / "config.json"
    config = cast(dict[str, object], json.loads(config_path.read_text()))
    # The weights are now plain float32: a quantization entry would make mlx-lm rebuild quantized layers.
    for key in ("quantization", "quantization_config"):
        config.pop(key, None)
    config["torch_dtype"] = "float32"
    config_path.write_text(json.dumps(config, indent=2))


def _answer(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _planned_copy(model_path: Path) -> LoadedModel:
    """The model loaded again with exo's matmul plan: the raw copy keeps mlx-lm's own products for its generations."""
    loaded = load_model(model_path, ShardAssignment())
    if (planner := MatmulPlanner.for_loaded(loaded)) is not None:
        planner.finish()  # as exo's runner does while idle, before the bench measures it
    return loaded


def main() -> None:
    setup = RawSetup.model_validate_json(sys.argv[1])
    loaded = load_model(setup.model_path, ShardAssignment())
    planned: LoadedModel | None = None
    save_float32_copy(loaded, setup.model_path, setup.float32_copy)
    # Warm-up: first-call allocation and kernel setup are not throughput.
    measure_once(loaded, _prompt_tokens(loaded, "warm-up"), WARM_UP_MAX_TOKENS)
    _answer(RawReady(dtype=loaded.dtype, matmul_gflops=measure_matmul_gflops()).model_dump_json())
    for line in sys.stdin:
        match _REQUESTS.validate_json(line):
            case RawRequest(tag=tag, max_tokens=max_tokens):
                answer = measure_once(loaded, _prompt_tokens(loaded, tag), max_tokens).model_dump_json()
            case PassCostRequest() as request:
                if request.planned and planned is None:
                    planned = _planned_copy(setup.model_path)
                timed = planned if request.planned and planned is not None else loaded
                answer = measure_pass_costs(timed, _prompt_tokens(timed, "pass costs"), request).model_dump_json()
        _answer(answer)


if __name__ == "__main__":
    main()
