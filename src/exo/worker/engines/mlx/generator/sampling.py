"""A request's sampler and penalty processors, built from its SamplingParams.

Greedy requests share mlx-lm's one `greedy_sampler` function: mlx-lm's batch generator samples a batch in a single
call when every member has the same sampler object. A temperature request gets a `SeededSampler` with a random
stream of its own: draw `i` uses a key derived from (seed, i) alone, so the tokens a seeded request samples depend
on its seed and its logits, never on which other requests share the batch or in which order they sample (the
global `mx.random` state would interleave every member's draws).
"""

import secrets
from collections.abc import Callable, Sequence
from typing import Final, cast

import mlx.core as mx
import numpy as np
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, greedy_sampler, make_logits_processors

from exo.shared.types.api import MAX_SEED
from exo.shared.types.tasks import SamplingParams
from exo.worker.engines.mlx.step_clock import STEP_CLOCK

Sampler = Callable[[mx.array], mx.array]
LogitsProcessor = Callable[[mx.array, mx.array], mx.array]

GREEDY: Final[Sampler] = greedy_sampler
_MASK64: Final = (1 << 64) - 1

# Sampling multiplies logprobs by 1 / temperature in the model's dtype: below this, 1 / temperature passes what half
# precision holds (65504), a certain token's logprob of 0 becomes 0 * inf = NaN and the sample is garbage. A
# temperature this small means "the likeliest token", so it is sampled greedily.
GREEDY_BELOW_TEMPERATURE: Final = 1e-4


class InvalidSamplingError(ValueError):
    """A sampling value mlx cannot use; `param` names the request field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def check_sampling(sampling: SamplingParams, vocabulary_size: int) -> None:
    """Raise InvalidSamplingError for what mlx would fail on mid-request (the API refuses these first; this keeps
    every front end from turning them into a failed generation)."""
    if sampling.seed is not None and not 0 <= sampling.seed <= MAX_SEED:
        raise InvalidSamplingError("seed", f"seed must be between 0 and {MAX_SEED}, got {sampling.seed}")
    if not 0 <= sampling.top_k < vocabulary_size:
        raise InvalidSamplingError(
            "top_k", f"top_k must be below the model's vocabulary size of {vocabulary_size}, got {sampling.top_k}"
        )


def sampling_temperature(requested: float) -> float:
    """The temperature sampled with: `requested`, or 0 (greedy) below GREEDY_BELOW_TEMPERATURE."""
    return requested if requested >= GREEDY_BELOW_TEMPERATURE else 0.0


def _mix64(value: int) -> int:
    """splitmix64's finaliser: consecutive draw numbers become unrelated 64-bit key seeds."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


class SeededSampler:
    """Temperature sampling (after top-p, min-p and top-k truncation) from a random stream owned by one request."""

    def __init__(self, sampling: SamplingParams, seed: int) -> None:
        self._inverse_temperature: Final = 1.0 / sampling_temperature(sampling.temperature)
        self._seed: Final = seed & _MASK64
        self._top_p: Final = sampling.top_p
        self._min_p: Final = sampling.min_p
        self._top_k: Final = sampling.top_k
        self.draws = 0

    def __call__(self, logprobs: mx.array) -> mx.array:
        """One token per row of `logprobs` (shape (rows, vocabulary)), from draw number `draws`."""
        if 0.0 < self._top_p < 1.0:
            logprobs = apply_top_p(logprobs, self._top_p)
        if self._min_p != 0.0:
            logprobs = apply_min_p(logprobs, self._min_p)
        if 0 < self._top_k < logprobs.shape[-1]:  # a k past the vocabulary keeps every token
            logprobs = apply_top_k(logprobs, self._top_k)
        key = mx.random.key(_mix64(self._seed ^ _mix64(self.draws)))
        self.draws += 1
        return mx.random.categorical(logprobs * self._inverse_temperature, key=key)


def make_request_sampler(sampling: SamplingParams) -> Sampler:
    """`GREEDY` at temperature 0 (or one too small to sample with); otherwise a SeededSampler on the request's seed (a
    random one when it has none)."""
    if sampling_temperature(sampling.temperature) == 0:
        return GREEDY
    seed = sampling.seed if sampling.seed is not None else secrets.randbits(64)
    return SeededSampler(sampling, seed)


def penalty_processors(sampling: SamplingParams) -> Sequence[LogitsProcessor]:
    """mlx-lm's repetition/presence/frequency penalties over the last 20 tokens (none when not asked for)."""
    return make_logits_processors(
        repetition_penalty=sampling.repetition_penalty,
        presence_penalty=sampling.presence_penalty,
        frequency_penalty=sampling.frequency_penalty,
    )


def greedy_rows(logits: mx.array, *, on_host: bool = False) -> mx.array:
    """Each row's largest logit (the first, where several are). `on_host`: the model's step runs on the host
    synchronously (the CPU engine's decode graph), so its logits are already computed and numpy picks them: mlx's CPU
    argmax took 0.15 ms over the default model's 151,936 logits, numpy's 0.012 ms. Elsewhere mlx's argmax, lazily,
    so the pick joins the forward pass on the device."""
    if on_host:
        return mx.array(np.argmax(np.asarray(logits), axis=-1).astype(np.uint32))
    return mx.argmax(logits, axis=-1)


def sample_rows(sampler: Sampler, logits: mx.array, *, on_host: bool = False) -> mx.array:
    """The next token of each row of `logits` (processed, not normalized): a greedy sampler takes the largest logit
    (`greedy_rows`), which normalizing (subtracting one constant per row: a `logsumexp` over the vocabulary, several
    milliseconds per row on mlx's CPU backend) would not change; any other sampler draws from the normalized
    log-probabilities."""
    if sampler is GREEDY:
        return greedy_rows(logits, on_host=on_host)
    return sampler(logits - mx.logsumexp(logits, axis=-1, keepdims=True))


def read_tokens(samples: mx.array) -> list[int]:
    """The token ids a step sampled (a 1-D array), waiting for the step: the wait is the device's, on the step clock."""
    with STEP_CLOCK.part("device"):
        return cast(list[int], samples.tolist())
