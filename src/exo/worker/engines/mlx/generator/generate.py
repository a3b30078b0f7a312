"""Token generation on top of `mlx_lm.stream_generate`: sampling, limits and typed output."""

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

import mlx.core as mx
from mlx_lm.generate import stream_generate
from mlx_lm.sample_utils import make_logits_processors, make_sampler

from exo.shared.types.api import MAX_SEED
from exo.shared.types.tasks import SamplingParams
from exo.shared.types.worker.runner_response import GenerationResponse
from exo.worker.engines.mlx.prompt_budget import context_exceeded
from exo.worker.engines.mlx.utils_mlx import LoadedModel

LogitsProcessor = Callable[[mx.array, mx.array], mx.array]


# mlx-lm samples from logprobs * (1 / temperature) in the model's dtype: below this, 1 / temperature passes what half
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


def clamp_max_tokens(requested: int | None, prompt_length: int, context_length: int) -> int:
    """Clamp to what fits in the context (clients like opencode ask for 32k regardless of the model)."""
    room = context_length - prompt_length
    if room <= 0:
        raise context_exceeded(prompt_length, context_length)
    return room if requested is None else min(requested, room)


def generate_tokens(
    loaded: LoadedModel,
    prompt_tokens: Sequence[int],
    *,
    sampling: SamplingParams,
    max_tokens: int,
    prompt_cache: list[Any] | None = None,
    logits_processors: Sequence[LogitsProcessor] = (),
) -> Iterator[GenerationResponse]:
    """Yield one GenerationResponse per generated token; the last one carries finish_reason "stop" or "length".

    `prompt_tokens` are the tokens still to prefill: with a prefix cache, only the part after the cached prefix.
    """
    if sampling.seed is not None:
        mx.random.seed(sampling.seed)
    sampler = make_sampler(
        temp=sampling_temperature(sampling.temperature),
        top_p=sampling.top_p if sampling.top_p < 1.0 else 0.0,
        min_p=sampling.min_p,
        top_k=sampling.top_k,
    )
    # Penalties first: a grammar constraint must see (and mask) the final logits.
    penalties = make_logits_processors(
        repetition_penalty=sampling.repetition_penalty,
        presence_penalty=sampling.presence_penalty,
        frequency_penalty=sampling.frequency_penalty,
    )
    processors = [*penalties, *logits_processors]
    for response in stream_generate(
        loaded.model,
        loaded.tokenizer,
        mx.array(list(prompt_tokens)),
        max_tokens=max_tokens,
        sampler=sampler,
        prompt_cache=prompt_cache,
        logits_processors=processors or None,
    ):
        finish = response.finish_reason
        yield GenerationResponse(
            text=response.text,
            token=response.token,
            finish_reason="stop" if finish == "stop" else "length" if finish == "length" else None,
        )
