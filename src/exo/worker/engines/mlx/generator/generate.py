"""Token generation for one prompt with exo's solo decoder: sampling, limits and typed output.

The runner drives requests through `ChatRequest` and the scheduler; this plain loop is the same decoder without the
chat semantics, for measuring and testing the decode path on its own.
"""

from collections.abc import Iterator, Sequence

from exo.shared.types.tasks import SamplingParams
from exo.shared.types.worker.runner_response import GenerationResponse
from exo.worker.engines.mlx.cache.layer_cache import PromptCache, new_prompt_cache
from exo.worker.engines.mlx.generator.prefill import PiecePacer, PromptPrefill
from exo.worker.engines.mlx.generator.processors import RequestProcessors
from exo.worker.engines.mlx.generator.sampling import LogitsProcessor, make_request_sampler, penalty_processors
from exo.worker.engines.mlx.generator.solo import SoloDecoder
from exo.worker.engines.mlx.loaded_model import LoadedModel
from exo.worker.engines.mlx.prompt_budget import context_exceeded

__all__ = ["LogitsProcessor", "clamp_max_tokens", "generate_tokens"]


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
    prompt_cache: PromptCache | None = None,
    logits_processors: Sequence[LogitsProcessor] = (),
) -> Iterator[GenerationResponse]:
    """Yield one GenerationResponse per generated token; the last one carries finish_reason "stop" or "length".

    `prompt_tokens` are the tokens still to prefill: with a prefix cache, only the part after the cached prefix.
    Penalties run first, then `logits_processors` (a grammar constraint must see and mask the final logits).
    """
    if not prompt_tokens:
        raise ValueError("prompt_tokens must not be empty")
    tokenizer = loaded.tokenizer
    eos_token_ids = set(tokenizer.eos_token_ids)
    detokenizer = tokenizer.detokenizer
    processors = RequestProcessors([*penalty_processors(sampling), *logits_processors], ())
    prefill = PromptPrefill(
        loaded.model,
        prompt_cache if prompt_cache is not None else new_prompt_cache(loaded.model),
        prompt_tokens,
        PiecePacer(),
    )
    while not prefill.finished:
        prefill.step()
    decoder = SoloDecoder(
        loaded.model,
        prefill.cache,
        fed=prefill.fed,
        pending=prefill.pending,
        sampler=make_request_sampler(sampling),
        processors=processors,
        drafts=None,
    )
    decoder.launch(0)
    generated = 0
    while True:
        (token,) = decoder.collect()
        if processors.error is not None:
            raise processors.error
        if token in eos_token_ids:
            detokenizer.finalize()
            yield GenerationResponse(text=detokenizer.last_segment, token=token, finish_reason="stop")
            return
        detokenizer.add_token(token)
        generated += 1
        if generated >= max_tokens:
            detokenizer.finalize()
            yield GenerationResponse(text=detokenizer.last_segment, token=token, finish_reason="length")
            return
        decoder.launch(0)
        yield GenerationResponse(text=detokenizer.last_segment, token=token)
