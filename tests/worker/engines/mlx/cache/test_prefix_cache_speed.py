"""Prefill saved by the prefix cache on a long conversation: the second turn, which reuses 2,052 of its 2,116
tokens, answers the same and in well under half the time of the same turn uncached (it prefills 3% of the tokens,
so only a machine whose load jumped more than tenfold between the two timings could fail it).

Sized (hidden 256, 4 layers, 2k tokens) to finish in about 20 s on mlx-cpu's reference BLAS, since pytest itself
runs without the optimized BLAS preloaded; the engine's real prompts are longer and its models bigger.
"""

import time
from collections.abc import Sequence

import pytest
from mlx import nn

from exo.worker.engines.mlx.cache import PrefixCache
from exo.worker.engines.mlx.cache.layer_cache import new_prompt_cache
from tests.worker.engines.mlx.cache.conftest import build_qwen2, greedy, random_tokens

CONVERSATION_TOKENS = 2048
NEW_MESSAGE_TOKENS = 64
ANSWER_TOKENS = 4


def _timed_turn(prefix_cache: PrefixCache, model: nn.Module, prompt: Sequence[int]) -> tuple[list[int], int, float]:
    start = time.perf_counter()
    lease = prefix_cache.acquire(prompt)
    answer = greedy(model, lease.remaining_tokens, lease.cache, ANSWER_TOKENS)
    elapsed = time.perf_counter() - start
    prefix_cache.release(lease, [*prompt, *answer])
    return answer, lease.cached_tokens, elapsed


@pytest.mark.slow
def test_second_turn_of_a_long_conversation_skips_the_shared_prefill_and_answers_the_same() -> None:
    model = build_qwen2(hidden_size=256, num_layers=4)
    prefix_cache = PrefixCache(model, memory_budget_bytes=1 << 30)
    first_turn = random_tokens(CONVERSATION_TOKENS, seed=50)

    first_answer, first_reused, first_seconds = _timed_turn(prefix_cache, model, first_turn)
    second_turn = [*first_turn, *first_answer, *random_tokens(NEW_MESSAGE_TOKENS, seed=51)]
    second_answer, second_reused, cached_seconds = _timed_turn(prefix_cache, model, second_turn)
    start = time.perf_counter()
    uncached_answer = greedy(model, second_turn, new_prompt_cache(model), ANSWER_TOKENS)
    uncached_seconds = time.perf_counter() - start

    print(
        f"\nprefix cache, {len(second_turn)}-token second turn: {uncached_seconds:.2f} s uncached, "
        f"{cached_seconds:.2f} s with {second_reused} tokens reused ({uncached_seconds / cached_seconds:.0f}x); "
        f"first turn {first_seconds:.2f} s; cache holds {prefix_cache.nbytes / 2**20:.0f} MiB"
    )
    assert first_reused == 0
    assert second_reused == len(first_turn) + len(first_answer)
    assert second_answer == uncached_answer
    assert cached_seconds < uncached_seconds / 2, (cached_seconds, uncached_seconds)
