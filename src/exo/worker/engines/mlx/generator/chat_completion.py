"""One chat completion inside the runner: prompt → (cached) prefill → tokens → stop sequences → tool parser → chunks."""

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from mlx_lm.tokenizer_utils import TokenizerWrapper

from exo.shared.types.chunks import (
    Chunk,
    ErrorChunk,
    FinishChunk,
    ParsedChunk,
    ReasoningChunk,
    Usage,
)
from exo.shared.types.common import FinishReason
from exo.shared.types.tasks import ChatCompletionTask, ToolPolicy
from exo.tool_calls import ToolFormatName, ToolStreamParser
from exo.tool_calls.grammar.spec import ReasoningMarkers, UnsupportedConstraintError
from exo.tool_calls.registry import format_for
from exo.worker.engines.mlx.cache.prefix_cache import PrefixCache
from exo.worker.engines.mlx.constrained import callable_functions, constraint_spec, make_logits_processor
from exo.worker.engines.mlx.generator.generate import (
    InvalidSamplingError,
    check_sampling,
    clamp_max_tokens,
    generate_tokens,
)
from exo.worker.engines.mlx.generator.stop_sequences import StopSequenceMatcher
from exo.worker.engines.mlx.prompt_budget import ContextLengthExceededError
from exo.worker.engines.mlx.utils_mlx import LoadedModel, apply_chat_template

logger = logging.getLogger(__name__)


@dataclass
class EngineContext:
    """What the runner keeps between tasks."""

    loaded: LoadedModel
    tool_format: ToolFormatName
    prefix_cache: PrefixCache | None


def reasoning_markers(tokenizer: TokenizerWrapper, starts_in_reasoning: bool) -> ReasoningMarkers | None:
    """The model's own think markers (none for models without them, so `<think>` stays plain content there)."""
    start, end = tokenizer.think_start, tokenizer.think_end
    if not tokenizer.has_thinking or not start or not end:
        return None
    return ReasoningMarkers(start=start, end=end, opened_in_prompt=starts_in_reasoning)


def _make_parser(context: EngineContext, policy: ToolPolicy, reasoning: ReasoningMarkers | None) -> ToolStreamParser:
    return ToolStreamParser(
        context.tool_format,
        callable_functions(policy),
        parallel_tool_calls=policy.parallel_tool_calls,
        starts_in_reasoning=reasoning is not None and reasoning.opened_in_prompt,
        reasoning_markers=(reasoning.start, reasoning.end) if reasoning else None,
    )


def _finish_reason(
    generation_finish: FinishReason | None, parser: ToolStreamParser, policy: ToolPolicy
) -> FinishReason:
    if generation_finish == "length":
        return "length"
    # OpenAI answers "stop" for a call forced by a named tool_choice (the caller asked for exactly that call and
    # needs no loop signal); every other reply with calls is "tool_calls", which agent loops run the calls on.
    if parser.tool_calls_emitted and policy.mode != "named":
        return "tool_calls"
    return "stop"


def run_chat_completion(
    context: EngineContext,
    task: ChatCompletionTask,
    should_cancel: Callable[[], bool],
) -> Iterator[Chunk]:
    """Yield the task's chunks; the last is a FinishChunk or an ErrorChunk (none if cancelled)."""
    loaded = context.loaded
    params = task.params
    try:
        check_sampling(params.sampling, loaded.vocabulary_size)
        prompt = apply_chat_template(
            loaded.tokenizer,
            params.messages,
            params.tool_policy,
            params.chat_template_kwargs,
            history=format_for(context.tool_format).history,
            context_length=loaded.context_length,
        )
        if params.count_prompt_only:
            yield FinishChunk(finish_reason="stop", usage=Usage(prompt_tokens=len(prompt.tokens), completion_tokens=0))
            return
        max_tokens = clamp_max_tokens(params.sampling.max_tokens, len(prompt.tokens), loaded.context_length)
    except InvalidSamplingError as error:
        yield ErrorChunk(error="invalid_request", message=str(error), param=error.param)
        return
    except ContextLengthExceededError as error:
        yield ErrorChunk(error="context_length_exceeded", message=str(error))
        return

    lease = context.prefix_cache.acquire(prompt.tokens) if context.prefix_cache else None
    to_prefill = lease.remaining_tokens if lease else prompt.tokens
    reasoning = reasoning_markers(loaded.tokenizer, prompt.starts_in_reasoning)
    try:
        # mlx-lm hands processors the tokens it was given (the uncached rest of the prompt) plus the sampled ones.
        spec = constraint_spec(params.tool_policy, params.structured_output, context.tool_format, reasoning)
        processors = (make_logits_processor(loaded.tokenizer, spec, prompt_length=len(to_prefill)),) if spec else ()
    except UnsupportedConstraintError as error:
        if lease and context.prefix_cache:
            context.prefix_cache.discard(lease)
        yield ErrorChunk(error="unsupported", message=str(error))
        return

    parser = _make_parser(context, params.tool_policy, reasoning)
    stops = StopSequenceMatcher(params.sampling.stop)
    generated: list[int] = []
    reasoning_tokens = 0
    generation_finish: FinishReason | None = None
    cancelled = False
    try:
        for response in generate_tokens(
            loaded,
            to_prefill,
            sampling=params.sampling,
            max_tokens=max_tokens,
            prompt_cache=lease.cache if lease else None,
            logits_processors=processors,
        ):
            if response.finish_reason != "stop":
                generated.append(response.token)
            chunks = parser.feed(stops.feed(response.text))
            if chunks and all(isinstance(chunk, ReasoningChunk) for chunk in chunks):
                reasoning_tokens += 1
            yield from chunks
            generation_finish = response.finish_reason
            if should_cancel():
                cancelled = True
                break
            if stops.stopped or parser.should_stop:
                generation_finish = "stop"
                break
    except Exception as error:
        logger.exception("generation failed for task %s", task.task_id)
        if lease and context.prefix_cache:
            context.prefix_cache.discard(lease)
        yield ErrorChunk(error="generation_failed", message=f"generation failed: {type(error).__name__}: {error}")
        return
    if lease and context.prefix_cache:
        context.prefix_cache.release(lease, [*prompt.tokens, *generated])
    if cancelled:
        return
    tail: list[ParsedChunk] = parser.feed(stops.flush()) + parser.finish()
    yield from tail
    for reason in parser.failures:
        logger.warning("task %s: tool call not parsed as intended: %s", task.task_id, reason)
    yield FinishChunk(
        finish_reason=_finish_reason(generation_finish, parser, params.tool_policy),
        stop_sequence=stops.matched,
        usage=Usage(
            prompt_tokens=len(prompt.tokens),
            completion_tokens=len(generated),
            cached_tokens=lease.cached_tokens if lease else 0,
            reasoning_tokens=reasoning_tokens,
        ),
    )
