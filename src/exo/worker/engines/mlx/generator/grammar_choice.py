"""Which processors decode a chat completion: at its start (penalties and the grammar its tool policy or
response_format needs), after a failed call was taken back to be repaired, and after the loop guard withdrew a call.
What each grammar holds is decided in tool_calls/grammar/policy.py; here it is compiled for the model and resumed
after the reply's tokens, and the request's take-back set up."""

import logging

from exo.shared.types.tasks import GenerationTask
from exo.tool_calls.grammar.policy import (
    ConstraintSpec,
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
from exo.tool_calls.loop_guard import CallKey
from exo.worker.engines.mlx.constrained import make_logits_processor
from exo.worker.engines.mlx.generator.processors import RequestProcessors
from exo.worker.engines.mlx.generator.request_context import EngineContext, LoopGuardCalls
from exo.worker.engines.mlx.generator.sampling import penalty_processors
from exo.worker.engines.mlx.generator.take_back import AnswerProcessors, RepairProcessors, TakeBack

logger = logging.getLogger(__name__)


def build_processors(
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


def open_take_back(
    context: EngineContext,
    task: GenerationTask,
    tools: RequestTools,
    guard: LoopGuardCalls,
    *,
    constrained: bool,
    reasoning: ReasoningMarkers | None,
    prefill_length: int,
) -> TakeBack | None:
    """The take-back of the calls that may be taken back (None where none may): failed calls a repair re-decodes,
    and the calls the loop guard withdraws (`constrained`: a grammar holds the request's calls from the start)."""
    withdrawn_tools = frozenset(call.name for call in guard.withdrawn)
    at_risk = withdrawn_tools
    repair: RepairProcessors | None = None
    at_risk_after_repair = frozenset[str]()
    enabled = repair_on(tools.policy, context.decode.tool_call_repair)
    if repairable(tools, task.params.structured_output is not None, enabled):
        repaired = tools_at_risk(tools, context.tool_format, grammar_held=constrained)
        if repaired:
            at_risk |= repaired
            repair = _repair_processors(
                context, task, tools, held=constrained, reasoning=reasoning, prefill_length=prefill_length
            )
            at_risk_after_repair = tools_at_risk(tools, context.tool_format, grammar_held=True) | withdrawn_tools
    answer = (
        _answer_processors(context, task, tools, reasoning=reasoning, prefill_length=prefill_length)
        if guard.withdrawn
        else None
    )
    if not at_risk:
        return None
    return TakeBack(
        task.task_id,
        at_risk,
        guard=guard,
        repair=repair,
        at_risk_after_repair=at_risk_after_repair,
        answer=answer,
    )


def _repair_processors(
    context: EngineContext,
    task: GenerationTask,
    tools: RequestTools,
    *,
    held: bool,
    reasoning: ReasoningMarkers | None,
    prefill_length: int,
) -> RepairProcessors:
    """The processors a failed call of the request is re-decoded under (`held`: a grammar held the call)."""

    def repair_processors(kept: list[int], failed: CallKey | None) -> RequestProcessors | None:
        spec = repair_spec(tools, context.tool_format, reasoning, grammar_held=held, failed=failed)
        if spec is None:
            return None
        return _resumed(
            context,
            task,
            spec,
            kept,
            prefill_length=prefill_length,
            unsupported="a failed tool call cannot be repaired",
            refused="a failed tool call cannot be repaired: the grammar refuses the text before it",
        )

    return repair_processors


def _answer_processors(
    context: EngineContext,
    task: GenerationTask,
    tools: RequestTools,
    *,
    reasoning: ReasoningMarkers | None,
    prefill_length: int,
) -> AnswerProcessors:
    """The processors a reply is decoded on with after the loop guard withdrew a call, resumed after the reply's
    tokens before the call (`withdrawal_spec` says which grammar)."""

    def answer_processors(kept: list[int], taken_away: frozenset[str]) -> RequestProcessors | None:
        spec = withdrawal_spec(tools, context.tool_format, reasoning, taken_away)
        if spec is None:
            return None
        return _resumed(
            context,
            task,
            spec,
            kept,
            prefill_length=prefill_length,
            unsupported="no reply without calls after a withdrawn call",
            refused=None,
        )

    return answer_processors


def _resumed(
    context: EngineContext,
    task: GenerationTask,
    spec: ConstraintSpec,
    kept: list[int],
    *,
    prefill_length: int,
    unsupported: str,
    refused: str | None,
) -> RequestProcessors | None:
    """Penalties and `spec`'s grammar, resumed after the reply's `kept` tokens; None (logged with `unsupported`, or
    `refused` where set) where the grammar cannot be built or does not allow those tokens."""
    try:
        grammar = make_logits_processor(context.loaded.tokenizer, spec, prompt_length=prefill_length)
    except UnsupportedConstraintError as error:
        logger.warning("task %s: %s: %s", task.task_id, unsupported, error)
        return None
    if not grammar.resume_after(kept):
        if refused is not None:
            logger.warning("task %s: %s", task.task_id, refused)
        return None
    return RequestProcessors(penalty_processors(task.params.sampling), (grammar,))
