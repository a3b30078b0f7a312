"""One chat completion's semantics, whoever decodes it: prompt → (cached) prefill inputs → tokens → stop sequences →
tool parser → chunks → finish.

`ChatRequest` is the per-request state. A decoder (alone with speculation, in a batch, or a pipeline-parallel one)
only produces token ids; it asks the request what to feed (prompt, cache, sampler, processors, limit) and hands every
token back through `accept`, which detokenizes it, applies stop sequences and the tool-call parser and decides when
the request is finished. So a request answers the same whichever decoder ran it.
"""

import copy
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

from mlx_lm.tokenizer_utils import TokenizerWrapper

from exo.shared.types.chunks import (
    Chunk,
    ErrorChunk,
    FinishChunk,
    ParsedChunk,
    PrefillProgressChunk,
    ReasoningChunk,
    Usage,
)
from exo.shared.types.common import FinishReason, TaskId
from exo.shared.types.tasks import GenerationTask, LoopGuardPolicy, ToolPolicy
from exo.shared.types.worker.decode_settings import DecodeSettings
from exo.tool_calls import ToolFormatName, ToolStreamParser
from exo.tool_calls.grammar.policy import (
    RequestTools,
    constraint_spec,
    grammar_optional,
    repair_on,
    repair_spec,
    repairable,
    tools_at_risk,
    withdrawal_spec,
)
from exo.tool_calls.grammar.spec import ReasoningMarkers, UnsupportedConstraintError
from exo.tool_calls.loop_guard import CallHistory, CallKey, ReplyCalls, kept_loop_finding, withdrawal_finding
from exo.tool_calls.registry import format_for
from exo.worker.engines.mlx.cache.layer_cache import PromptCache, new_prompt_cache
from exo.worker.engines.mlx.cache.prefix_cache import CacheLease, PrefixCache
from exo.worker.engines.mlx.chat_template import RenderedPrompt, apply_chat_template
from exo.worker.engines.mlx.constrained import make_logits_processor
from exo.worker.engines.mlx.cpu.matmul_planner import MatmulPlanner
from exo.worker.engines.mlx.generator.call_hold import CallHold, RepairProcessors, ReplyState
from exo.worker.engines.mlx.generator.copy_views import copy_views
from exo.worker.engines.mlx.generator.generate import clamp_max_tokens
from exo.worker.engines.mlx.generator.processors import RequestProcessors
from exo.worker.engines.mlx.generator.prompt_lookup import PromptLookup
from exo.worker.engines.mlx.generator.sampling import (
    GREEDY,
    InvalidSamplingError,
    Sampler,
    check_sampling,
    make_request_sampler,
    penalty_processors,
)
from exo.worker.engines.mlx.generator.stop_sequences import StopSequenceMatcher
from exo.worker.engines.mlx.loaded_model import LoadedModel
from exo.worker.engines.mlx.prompt_budget import ContextLengthExceededError
from exo.worker.engines.mlx.step_clock import STEP_CLOCK

logger = logging.getLogger(__name__)


@dataclass
class EngineContext:
    """What the runner keeps between tasks."""

    loaded: LoadedModel
    tool_format: ToolFormatName
    prefix_cache: PrefixCache | None
    decode: DecodeSettings = field(default_factory=DecodeSettings)
    # Refines the model's matmul plan while no task runs (None where nothing was planned).
    matmul_planner: MatmulPlanner | None = None


def reasoning_markers(tokenizer: TokenizerWrapper, starts_in_reasoning: bool) -> ReasoningMarkers | None:
    """The model's own think markers (none for models without them, so `<think>` stays plain content there)."""
    start, end = tokenizer.think_start, tokenizer.think_end
    if not tokenizer.has_thinking or not start or not end:
        return None
    return ReasoningMarkers(start=start, end=end, opened_in_prompt=starts_in_reasoning)


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


def loop_guard_policy(context: EngineContext, policy: ToolPolicy) -> LoopGuardPolicy:
    """The request's own loop-guard policy, else the node's."""
    return policy.loop_guard or context.decode.loop_guard


@dataclass(frozen=True)
class LoopGuardCalls:
    """What the loop guard does with the calls that would make a real loop (`CallHistory.looping_calls`)."""

    withdrawn: frozenset[CallKey] = frozenset()
    """Taken back once written; the reply is then decoded again without them."""
    policy: LoopGuardPolicy = "off"
    kept: frozenset[CallKey] = frozenset()
    """Real loops the request cannot take back (`kept_because` says why): sent as written, and reported."""
    kept_because: str = ""


def _loop_guard_calls(
    context: EngineContext, task: GenerationTask, history: CallHistory, *, rewinds: bool
) -> LoopGuardCalls:
    """What `block` and `answer` do with this request's real loops. Never a grammar that forbids a call's exact
    arguments: a model kept from closing the string it meant to write writes on, and the client would get a call
    the model never made. A loop is taken back once written, or, where the reply cannot go back, reported."""
    params = task.params
    policy = loop_guard_policy(context, params.tool_policy)
    looping = frozenset(history.looping_calls())
    if policy in ("off", "warn") or not looping:
        return LoopGuardCalls(policy=policy)
    if params.tool_policy.mode != "auto":
        why = f'tool_choice "{params.tool_policy.mode}" asks for a call, so the reply cannot go on without one'
    elif params.structured_output is not None:
        why = "a response_format holds the reply"
    elif not rewinds:
        why = "this instance's decoder cannot take a call back (pipeline-parallel)"
    else:
        return LoopGuardCalls(withdrawn=looping, policy=policy)
    return LoopGuardCalls(policy=policy, kept=looping, kept_because=why)


def _build_processors(
    context: EngineContext,
    task: GenerationTask,
    tools: RequestTools,
    prefill_length: int,
    reasoning: ReasoningMarkers | None,
) -> RequestProcessors:
    """Penalties plus the grammar the task's tool policy / response_format needs; raises UnsupportedConstraintError."""
    params = task.params
    spec = constraint_spec(
        tools,
        params.structured_output,
        context.tool_format,
        reasoning,
        auto_grammar=context.decode.auto_tool_grammar,
    )
    # Processors are shown the tokens fed after the cached prefix (the uncached rest of the prompt) plus the sampled
    # ones, whichever decoder runs the request.
    tokenizer = context.loaded.tokenizer
    try:
        grammars = (make_logits_processor(tokenizer, spec, prompt_length=prefill_length),) if spec else ()
    except UnsupportedConstraintError as error:
        if not grammar_optional(spec, tools):
            raise
        # The lazy "auto" grammar is a help, never a condition: without it calls are parsed and validated as before.
        logger.warning("tool calls of task %s are validated, not held to the schemas: %s", task.task_id, error)
        grammars = ()
    return RequestProcessors(penalty_processors(params.sampling), grammars)


def _repair_enabled(context: EngineContext, task: GenerationTask, tools: RequestTools) -> bool:
    """Whether a failed call of this request may be repaired at all (see tool_calls/grammar/policy.py)."""
    enabled = repair_on(tools.policy, context.decode.tool_call_repair)
    return repairable(tools, task.params.structured_output is not None, enabled)


def _call_repair(
    context: EngineContext,
    task: GenerationTask,
    tools: RequestTools,
    *,
    held: bool,
    reasoning: ReasoningMarkers | None,
    prefill_length: int,
) -> RepairProcessors:
    """The processors a failed call of the request is re-decoded under (`held`: a grammar held the call)."""
    params = task.params

    def repair_processors(kept: list[int], failed: CallKey | None) -> RequestProcessors | None:
        spec = repair_spec(tools, context.tool_format, reasoning, grammar_held=held, failed=failed)
        if spec is None:
            return None
        try:
            grammar = make_logits_processor(context.loaded.tokenizer, spec, prompt_length=prefill_length)
        except UnsupportedConstraintError as error:
            logger.warning("task %s: a failed tool call cannot be repaired: %s", task.task_id, error)
            return None
        if not grammar.resume_after(kept):
            logger.warning(
                "task %s: a failed tool call cannot be repaired: the grammar refuses the text before it", task.task_id
            )
            return None
        return RequestProcessors(penalty_processors(params.sampling), (grammar,))

    return repair_processors


AnswerProcessors = Callable[[list[int], frozenset[str]], RequestProcessors | None]
"""Given the reply's tokens before a withdrawn call and the tools to take away (empty: every tool), the processors
to decode on without them (None: the reply ends where the call began)."""


def _answer_processors(
    context: EngineContext,
    task: GenerationTask,
    tools: RequestTools,
    *,
    reasoning: ReasoningMarkers | None,
    prefill_length: int,
) -> AnswerProcessors:
    """The processors a reply is decoded on with after the loop guard withdrew a call, resumed after the reply's
    tokens before the call: the lazy grammar of the tools left (`block`: the model may call another tool or answer),
    or that of `tool_choice: "none"` (text that never opens a call) where none is left or `answer` takes them all."""
    params = task.params

    def answer_processors(kept: list[int], taken_away: frozenset[str]) -> RequestProcessors | None:
        spec = withdrawal_spec(tools, context.tool_format, reasoning, taken_away)
        if spec is None:
            return None
        try:
            grammar = make_logits_processor(context.loaded.tokenizer, spec, prompt_length=prefill_length)
        except UnsupportedConstraintError as error:
            logger.warning("task %s: no reply without calls after a withdrawn call: %s", task.task_id, error)
            return None
        if not grammar.resume_after(kept):
            return None
        return RequestProcessors(penalty_processors(params.sampling), (grammar,))

    return answer_processors


class ImmediateReplyError(Exception):
    """The request is answered without decoding: `chunk` is its whole answer (a refusal the API turns into an HTTP
    error, or the prompt-token count a counting request asked for)."""

    def __init__(self, chunk: ErrorChunk | FinishChunk) -> None:
        super().__init__(chunk.message if isinstance(chunk, ErrorChunk) else "prompt tokens counted")
        self.chunk = chunk


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
        self._tools = tools
        self._parser = _make_parser(context, tools, reasoning)
        self._history = history
        self._reply_calls = ReplyCalls()
        self._lookup: PromptLookup | None = None
        self.generated: list[int] = []
        self._reasoning_tokens = 0
        self.finish_reason: FinishReason | None = None
        self._closed = False
        self._prefill_ended = False
        self._hold: CallHold | None = None
        self._repair: RepairProcessors | None = None
        self._at_risk_after_repair: frozenset[str] = frozenset()
        self._guard = LoopGuardCalls()
        self._answer: AnswerProcessors | None = None
        self._withdrawals: list[str] = []
        """What the loop guard reported about each call it took back from this reply."""
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
        guard = _loop_guard_calls(context, task, history, rewinds=rewinds)
        tools = RequestTools.of(params.tool_policy)
        try:
            processors = _build_processors(context, task, tools, len(prefill), reasoning)
        except UnsupportedConstraintError as error:
            if lease and context.prefix_cache:
                context.prefix_cache.discard(lease)
            raise ImmediateReplyError(ErrorChunk(error="unsupported", message=str(error))) from error
        request = cls(
            context,
            task,
            prompt=prompt,
            max_tokens=max_tokens,
            lease=lease,
            processors=processors,
            reasoning=reasoning,
            history=history,
            tools=tools,
        )
        request._guard = guard
        if rewinds:
            request._hold_calls(guard, reasoning=reasoning, prefill_length=len(prefill))
        return request

    def _hold_calls(self, guard: LoopGuardCalls, *, reasoning: ReasoningMarkers | None, prefill_length: int) -> None:
        """Hold back the calls that may be taken back: failed calls a repair re-decodes, and the calls the loop
        guard withdraws (`answer`)."""
        context, task, tools = self._context, self._task, self._tools
        withdrawn_tools = frozenset(call.name for call in guard.withdrawn)
        at_risk = withdrawn_tools
        if _repair_enabled(context, task, tools):
            held = self.processors.constrained
            repaired = tools_at_risk(tools, context.tool_format, grammar_held=held)
            if repaired:
                at_risk |= repaired
                self._repair = _call_repair(
                    context, task, tools, held=held, reasoning=reasoning, prefill_length=prefill_length
                )
                self._at_risk_after_repair = (
                    tools_at_risk(tools, context.tool_format, grammar_held=True) | withdrawn_tools
                )
        if guard.withdrawn:
            self._answer = _answer_processors(context, task, tools, reasoning=reasoning, prefill_length=prefill_length)
        if at_risk:
            self._hold = CallHold(at_risk)

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
        hold = self._hold
        if hold is not None:
            hold.remember(self._reply_state, self._parser)
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
        if hold is not None:
            settled = self._settle(hold, chunks, failures)
            if settled is None:
                return []
            chunks = settled
        self._reply_calls.add(chunks)
        if chunks and all(isinstance(chunk, ReasoningChunk) for chunk in chunks):
            self._reasoning_tokens += 1
        if self.finish_reason is None and (self._stops.stopped or self._parser.should_stop):
            self.finish_reason = "stop"
        return chunks

    def _settle(self, hold: CallHold, chunks: list[ParsedChunk], failures_before: int) -> list[ParsedChunk] | None:
        """The chunks of a token to send, or None where the call they belong to was taken back (the reply went back
        to where the call started)."""
        failed = self._failed_call(failures_before)
        if failed is not None:
            return None if self._rewind(hold, failed) else hold.give_up(chunks)
        repeat = self._written_repeat(hold, chunks)
        if repeat is not None:
            self._withdraw(hold, repeat)
            return None
        return hold.route(chunks, self._parser)

    def _ended_by_model(self) -> bool:
        return self.finish_reason == "stop" and not self._stops.stopped and not self._parser.should_stop

    def _failed_call(self, failures_before: int) -> tuple[CallKey | None] | None:
        """After a token: `(the failed call,)` when a call failed with it (None inside: failed before its name was
        read), including a call the end of the turn leaves broken; None when no call failed."""
        parser = self._parser
        if parser.call_failures == failures_before and self._ended_by_model() and parser.in_call:
            parser = parser.snapshot()  # what finishing the reply here would make of the open call
            parser.feed(copy.deepcopy(self._stops).flush())
            parser.finish()
        if parser.call_failures == failures_before:
            return None
        failed = parser.failed_call
        return (CallKey.of(*failed) if failed else None,)

    def _written_repeat(self, hold: CallHold, chunks: list[ParsedChunk]) -> CallKey | None:
        """The call the loop guard withdraws, when the held call ends with this token as one of them."""
        if not self._guard.withdrawn or self.finish_reason == "length" or self._stops.stopped:
            return None
        parser, tail = self._parser, list[ParsedChunk]()
        if parser.in_call:
            if not self._ended_by_model():
                return None
            parser = parser.snapshot()  # what finishing the reply here would make of the open call
            tail = [*parser.feed(copy.deepcopy(self._stops).flush()), *parser.finish()]
        call = hold.first_call([*chunks, *tail])
        return call if call in self._guard.withdrawn else None

    def _withdraw(self, hold: CallHold, call: CallKey) -> None:
        """Take the looping call back: the reply goes on from where it began without calls (`answer`) or without
        the looping tools (`block`, once), or, where it already made other calls (or the text before the call does
        not fit that grammar), ends there."""
        state = hold.withdraw()
        assert state is not None
        block = self._guard.policy == "block" and not self._withdrawals
        taken_away = frozenset(looping.name for looping in self._guard.withdrawn) if block else frozenset[str]()
        answer = self._answer if not self._reply_calls.keys() else None
        processors = answer(self.generated[: state.generated], taken_away) if answer is not None else None
        self._go_back(state)
        if processors is None:
            then = "the reply ended there"
        elif taken_away:
            then = f"the reply was decoded again without {', '.join(sorted(taken_away))}"
        else:
            then = "the reply was decoded again without calls"
        self._withdrawals.append(withdrawal_finding(call, then))
        logger.info("task %s: agent loop: repeated call %s withdrawn, %s", self.task_id, call.describe(), then)
        if processors is None:
            self.finish_reason = "stop"
            return
        self.processors = processors
        # Under `block` a looping tool is out of the grammar; should it come back anyway, it is withdrawn again.
        hold.hold(frozenset(looping.name for looping in self._guard.withdrawn) if taken_away else frozenset())
        self._rewound_to = state.generated

    def _rewind(self, hold: CallHold, failed: tuple[CallKey | None]) -> bool:
        """Go back to where the failed call started, to re-decode it under the repair grammar (False where the call
        stays as the failure rule makes it)."""
        if self._repair is None or self.finish_reason == "length" or self._stops.stopped:
            return False
        rewind = hold.repair(self.generated, failed[0], self._repair)
        if rewind is None:
            return False
        state, processors = rewind
        logger.info("task %s: a failed tool call is re-decoded under the grammar", self.task_id)
        self._go_back(state)
        self.processors = processors
        hold.hold(self._at_risk_after_repair)
        self._rewound_to = state.generated
        return True

    def _go_back(self, state: ReplyState) -> None:
        """The reply as it was in `state` (its tokens after that dropped)."""
        self._parser = state.parser.snapshot()
        self._stops = copy.deepcopy(state.stops)
        self._reasoning_tokens = state.reasoning_tokens
        del self.generated[state.generated :]
        self._detokenizer.reset()
        for token in self.generated:
            self._detokenizer.add_token(token)
        _ = self._detokenizer.last_segment  # the parser has read this text already
        self._lookup = None
        self.finish_reason = None

    def finish(self, cache: PromptCache | None) -> list[Chunk]:
        """The last chunks (the parser's held-back text, then the FinishChunk); stores `cache` for later prompts."""
        self._release(cache)
        held = self._hold.release() if self._hold is not None else []
        tail = [*held, *self._parser.feed(self._stops.flush()), *self._parser.finish()]
        self._reply_calls.add(tail)
        for reason in self._parser.failures:
            logger.warning("task %s: tool call not parsed as intended: %s", self.task_id, reason)
        calls = self._reply_calls.keys()
        guard = self._guard
        guarded = guard.policy != "off"
        kept = [kept_loop_finding(call, guard.kept_because) for call in calls if call in guard.kept]
        warnings = (*self._history.findings(calls), *kept, *self._withdrawals) if guarded else ()
        for warning in warnings:
            logger.warning("task %s: agent loop: %s", self.task_id, warning)
        usage = Usage(
            prompt_tokens=len(self._prompt.tokens),
            completion_tokens=len(self.generated),
            cached_tokens=self._lease.cached_tokens if self._lease else 0,
            disk_cached_tokens=self._lease.disk_cached_tokens if self._lease else 0,
            reasoning_tokens=self._reasoning_tokens,
            repeated_tool_calls=self._history.repeated(calls) + len(self._withdrawals) if guarded else 0,
            withdrawn_tool_calls=len(self._withdrawals),
        )
        finish = FinishChunk(
            finish_reason=_finish_reason(self.finish_reason, bool(calls)),
            stop_sequence=self._stops.matched,
            usage=usage,
            loop_warnings=warnings,
        )
        return [*tail, finish]

    def cancel(self, cache: PromptCache | None) -> None:
        """The client went away: no more chunks; what was computed still fills the prefix cache."""
        self._release(cache)

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
