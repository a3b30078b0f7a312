"""The raw baselines' measurements: a bare `mlx_lm.stream_generate` loop and bare decode steps. Imports nothing of
exo's engine, so the stock worker can use it."""

import sys
import time
from typing import cast

import mlx.core as mx
from mlx import nn
from mlx_lm.generate import stream_generate
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache
from mlx_lm.sample_utils import make_sampler
from mlx_lm.tokenizer_utils import TokenizerWrapper

from bench.raw_protocol import PassCostRequest, PassCosts
from bench.results import StreamMeasurement
from bench.workloads import decode_messages


def prompt_tokens(tokenizer: TokenizerWrapper, tag: str) -> list[int]:
    messages = [message.model_dump(exclude_none=True) for message in decode_messages(tag)]
    return cast(list[int], tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))


def measure_once(
    model: nn.Module, tokenizer: TokenizerWrapper, prompt: list[int], max_tokens: int
) -> StreamMeasurement:
    """One greedy generation, timed like a client times a stream: first token, then the rest."""
    started = time.perf_counter()
    first_at: float | None = None
    tokens = 0
    pieces: list[str] = []
    for response in stream_generate(
        model, tokenizer, mx.array(prompt), max_tokens=max_tokens, sampler=make_sampler(0.0)
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


def measure_pass_costs(model: nn.Module, prompt: list[int], request: PassCostRequest) -> PassCosts:
    """What batching can gain here: a decode step over N sequences against one over a single sequence.

    Each batch size gets its own cache holding the prompt N times; every step feeds one token per sequence and is
    then taken back out of the cache, so all steps see the same context. The sizes take turns, repeat by repeat,
    so load from elsewhere falls on all of them; the first round only warms up.
    """
    caches: dict[int, list[object]] = {}
    for rows in request.rows:
        cache = make_prompt_cache(model)
        mx.eval(model(mx.array([prompt] * rows), cache=cache))
        caches[rows] = cache
    best: dict[int, float] = {}
    for repeat in range(request.repeats + 1):
        for rows, cache in caches.items():
            started = time.perf_counter()
            logits = model(mx.array([prompt[-1:]] * rows), cache=cache)
            mx.eval(mx.argmax(logits[:, -1, :], axis=-1))
            elapsed = time.perf_counter() - started
            trim_prompt_cache(cache, 1)
            if repeat > 0:
                best[rows] = min(best.get(rows, elapsed), elapsed)
    return PassCosts(seconds=best)


def exo_engine_imported() -> bool:
    """Whether any of exo's engine modules (its replacements among them) is loaded in this process."""
    return any(name == "exo.worker" or name.startswith("exo.worker.") for name in sys.modules)


def answer(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
