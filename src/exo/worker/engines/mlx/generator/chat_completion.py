"""One chat completion's semantics, whoever decodes it: prompt → (cached) prefill inputs → tokens → stop sequences →
tool parser → chunks → finish.

`ChatRequest` is the per-request state. A decoder (alone with speculation, in a batch, or a pipeline-parallel one)
only produces token ids; it asks the request what to feed (prompt, cache, sampler, processors, limit) and hands every
token back through `accept`, which detokenizes it, applies stop sequences and the tool-call parser and decides when
the request is finished. So a request answers the same whichever decoder ran it.

Beside it: what the request is decoded with (request_context.py), which processors decode it (grammar_choice.py), and
the take-back of repaired or repeated calls (take_back.py), whose verdicts `accept` applies.
"""

import copy
import logging
from collections.abc import Sequence
from typing import cast

from exo.shared.types.chunks import (
    Chunk,
    ErrorChunk,
    FinishChunk,
    ParsedChunk,
    PrefillProgressChunk,
    ReasoningChunk,
    TokenChunk,
    Usage,
)
from exo.shared.types.common import FinishReason, TaskId
from exo.shared.types.tasks import GenerationTask
from exo.tool_calls import ToolStreamParser
from exo.tool_calls.grammar.policy import RequestTools
from exo.tool_calls.grammar.spec import ReasoningMarkers, UnsupportedConstraintError
from exo.tool_calls.loop_guard import (
    CallHistory,
    CallKey,
    ReplyCalls,
    kept_loop_finding,
    withdrawn_reply_notice,
)
from exo.tool_calls.registry import format_for
from exo.worker.engines.mlx.cache.layer_cache import PromptCache, new_prompt_cache
from exo.worker.engines.mlx.cache.prefix_cache import CacheLease
from exo.worker.engines.mlx.chat_template import RenderedPrompt, apply_chat_template
from exo.worker.engines.mlx.generator.copy_views import copy_views
from exo.worker.engines.mlx.generator.generate import clamp_max_tokens
from exo.worker.engines.mlx.generator.grammar_choice import build_processors, open_take_back
from exo.worker.engines.mlx.generator.processors import RequestProcessors
from exo.worker.engines.mlx.generator.prompt_lookup import PromptLookup
from exo.worker.engines.mlx.generator.request_context import (
    EngineContext,
    ImmediateReplyError,
    LoopGuardCalls,
    loop_guard_calls,
    reasoning_markers,
)
from exo.worker.engines.mlx.generator.sampling import (
    GREEDY,
    InvalidSamplingError,
    Sampler,
    check_sampling,
    make_request_sampler,
)
from exo.worker.engines.mlx.generator.stop_sequences import StopSequenceMatcher
from exo.worker.engines.mlx.generator.take_back import GoBack, ReplyState, TakeBack
from exo.worker.engines.mlx.prompt_budget import ContextLengthExceededError
from exo.worker.engines.mlx.step_clock import STEP_CLOCK

logger = logging.getLogger(__name__)


def _make_parser(context: EngineContext, tools: RequestTools, reasoning: ReasoningMarkers | None) -> ToolStreamParser:
    return ToolStreamParser(
        context.tool_format,
        tools.callable_functions,
        parallel_tool_calls=tools.policy.parallel_tool_calls,
        starts_in_reasoning=reasoning is not None and reasoning.opened_in_prompt,
        reasoning_markers=(reasoning.start, reasoning.end) if reasoning else None,
    )


def _finish_reason(generation_finish: FinishReason | None, sent_calls: bool) -> FinishReason:
    """ "tool_calls" exactly when the reply sent calls (a named tool_choice too: agent loops run the calls on that
    signal, and a message with calls and "stop" is one they stop on), unless `max_tokens` cut it."""
    if generation_finish == "length":
        return "length"
    return "tool_calls" if sent_calls else "stop"


class ChatRequest:
    """The state of one chat completion while some decoder produces its tokens."""

    def __init__(
        self,
        context: EngineContext,
        task: GenerationTask,
        *,
        prompt: RenderedPrompt,
        max_tokens: int,
        lease: CacheLease | None,
        processors: RequestProcessors,
        reasoning: ReasoningMarkers | None,
        history: CallHistory,
        tools: RequestTools,
        guard: LoopGuardCalls,
        take_back: TakeBack | None,
    ) -> None:
        self.task_id: TaskId = task.task_id
        self._task = task
        self._context = context
        self._prompt = prompt
        self._lease = lease
        self.max_tokens = max_tokens
        self.processors = processors
        self.sampler: Sampler = make_request_sampler(task.params.sampling)
        self._eos_token_ids = frozenset(context.loaded.tokenizer.eos_token_ids)
        self._detokenizer = context.loaded.tokenizer.detokenizer
        self._stops = StopSequenceMatcher(task.params.sampling.stop)
        self._parser = _make_parser(context, tools, reasoning)
        self._history = history
        self._reply_calls = ReplyCalls()
        self._wrote_text = False
        """Whether the reply has sent any visible text (an emptied reply gets the loop guard's notice instead)."""
        self._lookup: PromptLookup | None = None
        self.generated: list[int] = []
        self._reasoning_tokens = 0
        self.finish_reason: FinishReason | None = None
        self._closed = False
        self._prefill_ended = False
        self._guard = guard
        self._take_back = take_back
        self._rewound_to: int | None = None

    @classmethod
    def open(cls, context: EngineContext, task: GenerationTask, *, rewinds: bool = False) -> "ChatRequest":
        """Render the prompt, lease the prefix cache and build the processors; raises ImmediateReplyError.

        `rewinds`: the decoder can take a rewind (`take_rewind`), so a failed call may be repaired."""
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
                layout=context.decode.prompt_layout,
            )
            if params.count_prompt_only:
                usage = Usage(prompt_tokens=len(prompt.tokens), completion_tokens=0)
                raise ImmediateReplyError(FinishChunk(finish_reason="stop", usage=usage))
            max_tokens = clamp_max_tokens(params.sampling.max_tokens, len(prompt.tokens), loaded.context_length)
        except InvalidSamplingError as error:
            refusal = ErrorChunk(error="invalid_request", message=str(error), param=error.param)
            raise ImmediateReplyError(refusal) from error
        except ContextLengthExceededError as error:
            raise ImmediateReplyError(ErrorChunk(error="context_length_exceeded", message=str(error))) from error
        lease = context.prefix_cache.acquire(prompt.tokens) if context.prefix_cache else None
        prefill = lease.remaining_tokens if lease else prompt.tokens
        reasoning = reasoning_markers(loaded.tokenizer, prompt.starts_in_reasoning)
        history = CallHistory.of(params.messages)
        guard = loop_guard_calls(context, task, history, rewinds=rewinds)
        tools = RequestTools.of(params.tool_policy)
        try:
            processors = build_processors(context, task, tools, len(prefill), reasoning)
        except UnsupportedConstraintError as error:
            if lease and context.prefix_cache:
                context.prefix_cache.discard(lease)
            raise ImmediateReplyError(ErrorChunk(error="unsupported", message=str(error))) from error
        take_back = (
            open_take_back(
                context,
                task,
                tools,
                guard,
                constrained=processors.constrained,
                reasoning=reasoning,
                prefill_length=len(prefill),
            )
            if rewinds
            else None
        )
        return cls(
            context,
            task,
            prompt=prompt,
            max_tokens=max_tokens,
            lease=lease,
            processors=processors,
            reasoning=reasoning,
            history=history,
            tools=tools,
            guard=guard,
            take_back=take_back,
        )

    # ---- what a decoder feeds -------------------------------------------------------------------

    @property
    def task(self) -> GenerationTask:
        return self._task

    @property
    def prompt_tokens(self) -> list[int]:
        """The whole rendered prompt."""
        return list(self._prompt.tokens)

    @property
    def cached_tokens(self) -> int:
        """How many leading prompt tokens the leased cache holds (their prefill is skipped)."""
        return self._lease.cached_tokens if self._lease else 0

    def limit_cached_tokens(self, cached_tokens: int) -> None:
        """Reuse only the first `cached_tokens` of the leased prefix (the ranks of a pipeline reuse what every rank
        holds); the rest is prefilled. The grammar processors anchor on the prompt they are first shown."""
        if self._lease is not None and self._context.prefix_cache is not None:
            self._lease = self._context.prefix_cache.shorten(self._lease, cached_tokens)

    @property
    def prefill_tokens(self) -> list[int]:
        """The prompt tokens the cache does not hold yet: what to feed before the first token is sampled."""
        return self._lease.remaining_tokens if self._lease else list(self._prompt.tokens)

    def prefill_progress(self, done_tokens: int) -> PrefillProgressChunk:
        """Where this request's prefill stands once `done_tokens` of its prompt are computed or cached."""
        return PrefillProgressChunk(
            prompt_tokens=len(self._prompt.tokens),
            done_tokens=done_tokens,
            cached_tokens=self.cached_tokens,
            disk_cached_tokens=self._lease.disk_cached_tokens if self._lease else 0,
        )

    def take_cache(self) -> PromptCache:
        """The KV cache to start from (holding the cached prefix); the decoder owns it until it hands it back."""
        return self._lease.cache if self._lease else new_prompt_cache(self._context.loaded.model)

    @property
    def speculative(self) -> bool:
        """Whether prompt-lookup drafts may be verified for this request: greedy only, where a draft token is kept
        exactly when the model's own choice equals it (sampling would need a different acceptance rule)."""
        return self.sampler is GREEDY and self._context.decode.speculation is not None

    def propose_draft(self, limit: int) -> list[int]:
        """Draft tokens to follow the last generated one (none before the first token, or when not speculative)."""
        settings = self._context.decode.speculation
        if settings is None or not self.generated or not self.speculative:
            return []
        if self._lookup is None:
            self._lookup = PromptLookup([*self._prompt.tokens, *self.generated], settings, self._copy_references())
        return self._lookup.propose(limit)

    def _copy_references(self) -> list[list[int]]:
        """The conversation's texts as a tool call would copy them (JSON-escaped, without read-tool line numbers),
        tokenized: drafts for an edit's oldString or a rewritten file that the prompt as rendered cannot give."""
        tokenizer = self._context.loaded.tokenizer
        views = copy_views([message.content for message in self._task.params.messages])
        return [cast(list[int], tokenizer.encode(view, add_special_tokens=False)) for view in views]

    @property
    def remaining_tokens(self) -> int:
        """How many more tokens this request may generate."""
        return self.max_tokens - len(self.generated)

    # ---- what a decoder hands back --------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def accept(self, tokens: Sequence[int]) -> list[Chunk]:
        """Take generated `tokens` in order and return the chunks they produce; tokens after the finish are ignored.

        The first tokens are preceded by the progress chunk saying the whole prompt is read.
        """
        chunks: list[Chunk] = []
        if tokens and not self._prefill_ended:
            self._prefill_ended = True
            chunks.append(self.prefill_progress(len(self._prompt.tokens)))
        for token in tokens:
            if self.finish_reason is not None or self._rewound_to is not None:
                break
            chunks += self._accept_one(token)
        return chunks

    def take_rewind(self) -> int | None:
        """How many generated tokens the reply keeps after a repair went back to where a failed call started (the
        decoder drops the rest from its cache and decodes on with the new `processors`); None without a repair."""
        kept, self._rewound_to = self._rewound_to, None
        return kept

    def _reply_state(self) -> ReplyState:
        return ReplyState(
            parser=self._parser.snapshot(),
            stops=copy.deepcopy(self._stops),
            generated=len(self.generated),
            reasoning_tokens=self._reasoning_tokens,
        )

    def _accept_one(self, token: int) -> list[ParsedChunk]:
        take_back = self._take_back
        if take_back is not None:
            take_back.remember(self._reply_state, self._parser)
        if token in self._eos_token_ids:
            self._detokenizer.finalize()
            self.finish_reason = "stop"
        else:
            with STEP_CLOCK.part("detokenize"):
                self._detokenizer.add_token(token)
            self.generated.append(token)
            if self._lookup is not None:
                self._lookup.extend((token,))
            if len(self.generated) >= self.max_tokens:
                self._detokenizer.finalize()
                self.finish_reason = "length"
        failures = self._parser.call_failures
        with STEP_CLOCK.part("detokenize"):
            text = self._detokenizer.last_segment
        chunks = self._parser.feed(self._stops.feed(text))
        if take_back is not None:
            settled = take_back.settle(
                chunks,
                parser=self._parser,
                stops=self._stops,
                generated=self.generated,
                finish_reason=self.finish_reason,
                failures_before=failures,
                sent_calls=bool(self._reply_calls.keys()),
            )
            if isinstance(settled, GoBack):
                self._go_back(settled)
                return []
            chunks = settled
        self._reply_calls.add(chunks)
        self._wrote_text = self._wrote_text or _has_text(chunks)
        if chunks and all(isinstance(chunk, ReasoningChunk) for chunk in chunks):
            self._reasoning_tokens += 1
        if self.finish_reason is None and (self._stops.stopped or self._parser.should_stop):
            self.finish_reason = "stop"
        return chunks

    def _go_back(self, go_back: GoBack) -> None:
        """The reply as it was before the call taken back (its tokens after that dropped), decoding on under the new
        processors, or ended there where there are none."""
        state = go_back.state
        self._parser = state.parser.snapshot()
        self._stops = copy.deepcopy(state.stops)
        self._reasoning_tokens = state.reasoning_tokens
        del self.generated[state.generated :]
        self._detokenizer.reset()
        for token in self.generated:
            self._detokenizer.add_token(token)
        _ = self._detokenizer.last_segment  # the parser has read this text already
        self._lookup = None
        if go_back.processors is None:
            self.finish_reason = "stop"
            return
        self.finish_reason = None
        self.processors = go_back.processors
        self._rewound_to = state.generated

    def finish(self, cache: PromptCache | None) -> list[Chunk]:
        """The last chunks (the parser's held-back text, then the FinishChunk); stores `cache` for later prompts."""
        self._release(cache)
        take_back = self._take_back
        held = take_back.release() if take_back is not None else []
        tail = [*held, *self._parser.feed(self._stops.flush()), *self._parser.finish()]
        self._reply_calls.add(tail)
        for reason in self._parser.failures:
            logger.warning("task %s: tool call not parsed as intended: %s", self.task_id, reason)
        calls = self._reply_calls.keys()
        guard = self._guard
        guarded = guard.policy != "off"
        kept = [kept_loop_finding(call, guard.kept_because) for call in calls if call in guard.kept]
        withdrawals = take_back.withdrawals if take_back is not None else []
        if withdrawals and not calls and not self._wrote_text and not _has_text(tail):
            # The reply was all the withdrawn call: an empty answer would leave the user with nothing to read.
            tail.append(TokenChunk(text=withdrawn_reply_notice(withdrawals)))
        warnings = (*self._history.findings(calls), *kept, *withdrawals) if guarded else ()
        for warning in warnings:
            logger.warning("task %s: agent loop: %s", self.task_id, warning)
        finish = FinishChunk(
            finish_reason=_finish_reason(self.finish_reason, bool(calls)),
            stop_sequence=self._stops.matched,
            usage=self._usage(calls, len(withdrawals)),
            loop_warnings=warnings,
        )
        return [*tail, finish]

    def cancel(self, cache: PromptCache | None) -> Usage:
        """The client went away: no more chunks; what was computed still fills the prefix cache. Returns the usage so
        far (the calls sent and withdrawn before the cancel included), which the runner's counters still take."""
        self._release(cache)
        take_back = self._take_back
        return self._usage(self._reply_calls.keys(), len(take_back.withdrawals) if take_back is not None else 0)

    def _usage(self, calls: Sequence[CallKey], withdrawn: int) -> Usage:
        guarded = self._guard.policy != "off"
        return Usage(
            prompt_tokens=len(self._prompt.tokens),
            completion_tokens=len(self.generated),
            cached_tokens=self._lease.cached_tokens if self._lease else 0,
            disk_cached_tokens=self._lease.disk_cached_tokens if self._lease else 0,
            reasoning_tokens=self._reasoning_tokens,
            repeated_tool_calls=self._history.repeated(calls) + withdrawn if guarded else 0,
            withdrawn_tool_calls=withdrawn,
        )

    def fail(self, error: Exception) -> ErrorChunk:
        """Generation broke: the cache is dropped (it may be half-written) and the client gets an error."""
        logger.error("generation failed for task %s: %s: %s", self.task_id, type(error).__name__, error)
        if not self._closed and self._lease is not None and self._context.prefix_cache is not None:
            self._context.prefix_cache.discard(self._lease)
        self._closed = True
        return ErrorChunk(error="generation_failed", message=f"generation failed: {type(error).__name__}: {error}")

    def _release(self, cache: PromptCache | None) -> None:
        if self._closed:
            return
        self._closed = True
        prefix_cache = self._context.prefix_cache
        if self._lease is None or prefix_cache is None:
            return
        if cache is None:
            prefix_cache.discard(self._lease)
        else:
            prefix_cache.release(self._lease, [*self._prompt.tokens, *self.generated], cache=cache)


def _has_text(chunks: Sequence[ParsedChunk]) -> bool:
    return any(isinstance(chunk, TokenChunk) and chunk.text.strip() for chunk in chunks)
