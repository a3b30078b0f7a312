"""Overlap: a request decoding alone launches its next step on the lazily sampled token of the step in flight, before
that token is accepted (under a grammar, the forward pass alone: its mask follows once the token is accepted); a batch
step with a constrained member launches its forward pass before the members' masks, computed once its tokens were
accepted; a member joining the batch has its first forward pass launched before its first mask, and its first token
read after the running members' masks. Real
forward passes of the tiny-qwen-tools fixture through the runner's GenerationScheduler, each run twice, overlap on and
off (`DecodeSettings.overlap`): the chunks are the same, and so is the KV cache a request hands back when it ends or
is cancelled (its token count, and what a follow-up request finds cached). On mlx's CPU backend (these machines) the
overlap accepts a step's tokens on a helper thread while the next step launches (`beside.py`); the last tests also
compare it with the loop's own accept (`DecodeSettings.accept_beside`).
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypedDict, TypeVar, Unpack, cast

import mlx.core as mx
import pytest
from mlx_lm.generate import PromptProcessingBatch
from pydantic import JsonValue

from exo.shared.types.chunks import ToolCallChunk
from exo.shared.types.common import TaskId
from exo.shared.types.tasks import GenerationTask
from exo.shared.types.worker.decode_settings import DecodeSettings, LookupSettings
from exo.shared.types.worker.shards import ShardAssignment
from exo.tool_calls.grammar.policy import RequestTools, constraint_spec
from exo.worker.engines.mlx.cache.layer_cache import PromptCache, held_token_count
from exo.worker.engines.mlx.constrained import make_logits_processor
from exo.worker.engines.mlx.generator.batch_step import LazyLogprobsBatch
from exo.worker.engines.mlx.generator.beside import launch_computes_on_host
from exo.worker.engines.mlx.generator.chat_completion import ChatRequest
from exo.worker.engines.mlx.generator.processors import RequestProcessors
from exo.worker.engines.mlx.generator.request_context import EngineContext
from exo.worker.engines.mlx.generator.scheduler import GenerationScheduler, RequestUpdate
from exo.worker.engines.mlx.loaded_model import LoadedModel
from exo.worker.engines.mlx.model_loader import load_model
from tests.fixtures.fixture_specs import (
    FIXTURE_MODELS_DIR,
    GET_WEATHER_TOOL,
    PARIS_WEATHER_RESULT,
    qwen_tool_call_text,
    user,
)
from tests.worker.engines.mlx.generator.scheduling import (
    PARIS_LOOP,
    JsonBody,
    Outcome,
    assert_ended,
    context_for,
    push_text,
    run,
    task,
)
from tests.worker.engines.mlx.generator.test_scheduler import SHAPES

PLAIN = DecodeSettings(batch_size=16, speculation=None)
UNCONSTRAINED = ("greeting", "seeded temperature", "same seed again", "top_k", "repetition penalty", "stop sequence")
"""Shapes without a grammar (a request with tools has the lazy one under "auto"); the others decode under one."""
FAST_FORWARD = DecodeSettings(speculation=LookupSettings(adaptive=False), grammar_fast_forward=True)
"""Every forced token fed as a draft (the policy does not adapt to what multi-token passes cost here)."""


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_model(FIXTURE_MODELS_DIR / "tiny-qwen-tools", ShardAssignment())


class _Released:
    """The token count of every KV cache a request hands back (finished or cancelled), by task."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.held: dict[TaskId, int | None] = {}
        release = ChatRequest._release  # pyright: ignore[reportPrivateUsage]

        def recording(request: ChatRequest, cache: PromptCache | None) -> None:
            if cache is not None:
                self.held[request.task_id] = held_token_count(cache)
            release(request, cache)

        monkeypatch.setattr(ChatRequest, "_release", recording)


@dataclass(frozen=True)
class _Run:
    outcomes: list[Outcome]
    """In arrival order."""
    held: list[int | None]
    """The token count of each request's KV cache as it handed it back, in arrival order."""
    chained_steps: int
    chained_grammar_steps: int
    batch_grammar_steps: int
    batch_grammar_joins: int
    drafted: int
    """Draft tokens verified."""
    accepted_beside: int
    """Steps whose tokens were accepted on the helper thread while the next step launched (`beside.py`)."""


Arrivals = Callable[[], Mapping[int, Sequence[GenerationTask]]]
Cancels = Callable[[Mapping[int, Sequence[GenerationTask]]], Mapping[int, Sequence[TaskId]]]
Processors = Callable[[EngineContext, GenerationTask], RequestProcessors | None]


class _Options(TypedDict, total=False):
    """How a run goes beyond its settings and arrivals (each helper below passes them on to `_run`)."""

    cancel_at: Cancels
    processors: Processors
    rewinds: bool
    """Requests opened as the runner opens them, able to repair a failed call."""
    prepare: Callable[[GenerationScheduler], None]


def _run(
    loaded: LoadedModel,
    settings: DecodeSettings,
    arrivals: Arrivals,
    monkeypatch: pytest.MonkeyPatch,
    **options: Unpack[_Options],
) -> _Run:
    cancel_at, processors, prepare = options.get("cancel_at"), options.get("processors"), options.get("prepare")
    released = _Released(monkeypatch)
    context = context_for(loaded, settings)
    scheduler = GenerationScheduler(loaded.model, context.decode)
    if prepare is not None:
        prepare(scheduler)
    tasks = arrivals()
    ordered = [one for step in sorted(tasks) for one in tasks[step]]
    replaced: dict[TaskId, RequestProcessors] = {}
    for one in ordered:
        if processors is not None and (own := processors(context, one)) is not None:
            replaced[one.task_id] = own
    outcomes = run(
        context,
        tasks,
        scheduler=scheduler,
        cancel_at=cancel_at(tasks) if cancel_at else None,
        processors=replaced,
        rewinds=options.get("rewinds", False),
    )
    monkeypatch.undo()
    return _Run(
        outcomes=[outcomes[one.task_id] for one in ordered],
        held=[released.held.get(one.task_id) for one in ordered],
        chained_steps=scheduler.chained_steps,
        chained_grammar_steps=scheduler.chained_grammar_steps,
        batch_grammar_steps=scheduler.batch_grammar_steps,
        batch_grammar_joins=scheduler.batch_grammar_joins,
        drafted=scheduler.speculation.drafted,
        accepted_beside=scheduler.steps_accepted_beside,
    )


def _compared(
    loaded: LoadedModel,
    settings: tuple[DecodeSettings, DecodeSettings],
    arrivals: Arrivals,
    monkeypatch: pytest.MonkeyPatch,
    **options: Unpack[_Options],
) -> tuple[_Run, _Run]:
    """The same requests run under each of two settings: the chunks and the caches handed back are the same."""
    first, second = (_run(loaded, each, arrivals, monkeypatch, **options) for each in settings)
    assert [outcome.normalised() for outcome in second.outcomes] == [outcome.normalised() for outcome in first.outcomes]
    assert second.held == first.held
    assert all(held is not None for held in second.held)
    return first, second


def _same_with_and_without(
    loaded: LoadedModel,
    settings: DecodeSettings,
    arrivals: Arrivals,
    monkeypatch: pytest.MonkeyPatch,
    **options: Unpack[_Options],
) -> tuple[list[Outcome], _Run]:
    """Run the same requests with overlap off, then on, and check that the chunks and the caches handed back are the
    same: the outcomes, and the run with overlap on (none was chained with it off)."""
    off, on = _compared(
        loaded,
        (settings.model_copy(update={"overlap": False}), settings.model_copy(update={"overlap": True})),
        arrivals,
        monkeypatch,
        **options,
    )
    assert off.chained_steps == off.chained_grammar_steps == off.batch_grammar_steps == off.batch_grammar_joins == 0
    assert off.accepted_beside == 0
    return on.outcomes, on


@pytest.mark.parametrize("shape", list(SHAPES))
def test_each_request_shape_alone_is_the_same_with_overlap(
    loaded: LoadedModel, shape: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    (outcome,), on = _same_with_and_without(loaded, PLAIN, lambda: {0: [task(SHAPES[shape])]}, monkeypatch)
    finish = assert_ended(outcome)
    # Every step but the first (launched plainly) and the last (a length finish is not chained past) is chained,
    # under a grammar too: its forward pass runs while the mask is computed.
    assert on.chained_steps >= finish.usage.completion_tokens - 2 > 0
    assert on.chained_grammar_steps == (0 if shape in UNCONSTRAINED else on.chained_steps)
    # Where the launch computes on the host, every chained step's token was accepted beside it.
    assert on.accepted_beside == (on.chained_steps if launch_computes_on_host() else 0)


def test_requests_joining_and_leaving_a_batch_are_the_same_with_overlap(
    loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first request starts alone (chaining), the next ones arrive while it decodes and the batch forms around it
    # (its chained step is collected before it joins); the last ones leave one request alone again.
    def staggered() -> dict[int, list[GenerationTask]]:
        arrivals: dict[int, list[GenerationTask]] = {}
        for index, body in enumerate(SHAPES.values()):
            arrivals.setdefault(index * 5, []).append(task(body))
        return arrivals

    outcomes, on = _same_with_and_without(loaded, PLAIN, staggered, monkeypatch)
    assert on.chained_steps > 0
    assert (on.accepted_beside > on.chained_steps) == launch_computes_on_host()  # batch steps' tokens too
    for outcome in outcomes:
        assert_ended(outcome)


def _costly_drafts(scheduler: GenerationScheduler) -> None:
    """A machine where a pass over several tokens costs ten plain ones: the adaptive policy declines every draft."""
    for tokens in range(1, 10):
        scheduler.step_costs.record(tokens, 1.0 if tokens == 1 else 10.0)


COPYING: JsonBody = {
    "messages": [user("Repeat after me exactly: Hello! How can I help you today? Hello! How can I help you today?")],
    "max_tokens": 40,
}


def test_speculation_declining_drafts_chains_with_the_same_answer(
    loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    speculating = DecodeSettings(speculation=LookupSettings())
    for body in (COPYING, SHAPES["greeting"], SHAPES["stop sequence"]):
        (outcome,), on = _same_with_and_without(
            loaded, speculating, lambda body=body: {0: [task(body)]}, monkeypatch, prepare=_costly_drafts
        )
        assert on.chained_steps > 0
        assert on.drafted == 0
        # The output is what decoding without speculation gives.
        (plain,), _ = _same_with_and_without(loaded, PLAIN, lambda body=body: {0: [task(body)]}, monkeypatch)
        assert outcome.normalised() == plain.normalised()


def test_speculation_verifying_drafts_waits_for_them_with_the_same_answer(
    loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every draft verified (the policy does not adapt): a step after a token with a draft waits for that token and
    # verifies it; the steps after a token without one are chained.
    verifying = DecodeSettings(speculation=LookupSettings(adaptive=False))
    (outcome,), on = _same_with_and_without(loaded, verifying, lambda: {0: [task(COPYING)]}, monkeypatch)
    assert on.chained_steps > 0
    assert on.drafted > 0
    (plain,), _ = _same_with_and_without(loaded, PLAIN, lambda: {0: [task(COPYING)]}, monkeypatch)
    assert outcome.normalised() == plain.normalised()


@pytest.mark.parametrize("step", [2, 5, 9])
def test_a_cancel_mid_stream_is_the_same_with_overlap(
    loaded: LoadedModel, step: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    body: JsonBody = {"messages": [user("What is the weather in Paris and Tokyo?")], "tools": [GET_WEATHER_TOOL]}
    unconstrained: JsonBody = {**body, "auto_tool_grammar": False}

    def cancel(arrivals: Mapping[int, Sequence[GenerationTask]]) -> dict[int, list[TaskId]]:
        return {step: [one.task_id for one in arrivals[0]]}

    for shape in (body, unconstrained, SHAPES["greeting"], SHAPES["tool_choice required"], SHAPES["response_format"]):
        (outcome,), _ = _same_with_and_without(
            loaded, PLAIN, lambda shape=shape: {0: [task(shape)]}, monkeypatch, cancel_at=cancel
        )
        assert outcome.chunks  # it had started, and it got no Finish chunk
        assert not any(chunk.model_dump().get("finish_reason") for chunk in outcome.chunks)


def test_a_follow_up_finds_the_same_cached_prefix_with_overlap(loaded: LoadedModel) -> None:
    # A greeting that ends with the end-of-turn token, one cut by max_tokens and one by a stop sequence; then each
    # one's follow-up turn: what the prefix cache holds after the first is what the follow-up reads from it.
    hello: list[JsonValue] = [user("Hello!")]
    first_turns: list[JsonBody] = [{"messages": hello}, {"messages": hello, "max_tokens": 4}, SHAPES["stop sequence"]]
    found: dict[bool, list[tuple[int, list[str]]]] = {}
    for overlap in (False, True):
        settings = PLAIN.model_copy(update={"overlap": overlap})
        context = context_for(loaded, settings, prefix_cache_bytes=1 << 26)
        found[overlap] = []
        for first in first_turns:
            one = task(first)
            reply = run(context, {0: [one]})[one.task_id]
            conversation: list[JsonValue] = [*hello, {"role": "assistant", "content": reply.text}, user("Thanks!")]
            follow_up = task({"messages": conversation, "max_tokens": 8})
            again = run(context, {0: [follow_up]})[follow_up.task_id]
            found[overlap].append((assert_ended(again).usage.cached_tokens, again.normalised()))
    assert found[True] == found[False]
    assert all(cached > 0 for cached, _ in found[True])


@pytest.mark.parametrize("policy", ["answer", "block", "off"])
def test_the_loop_guards_take_back_is_the_same_with_overlap(
    loaded: LoadedModel, policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without the lazy grammar the repeated call is written on chained steps; the guard takes it back (the chained
    # step after the token that settles it is discarded) and the reply decodes on from before the call.
    body: JsonBody = {
        "messages": PARIS_LOOP,
        "tools": [GET_WEATHER_TOOL],
        "loop_guard": policy,
        "auto_tool_grammar": False,
        "max_tokens": 24,
    }
    paris = qwen_tool_call_text("get_weather", '{"city": "Paris"}')

    def pushed(context: EngineContext, one: GenerationTask) -> RequestProcessors | None:
        pushing = one.params.messages[-1].content == PARIS_WEATHER_RESULT  # the looping request, not the one beside
        return RequestProcessors((push_text(context.loaded, paris),), ()) if pushing else None

    for arrivals in (
        lambda: {0: [task(body)]},
        lambda: {0: [task(body), task({"messages": [user("What is the weather in Paris and Tokyo?")]})]},
    ):
        outcomes, on = _same_with_and_without(loaded, PLAIN, arrivals, monkeypatch, processors=pushed, rewinds=True)
        assert on.chained_steps > 0
        finish = assert_ended(outcomes[0])
        assert finish.usage.withdrawn_tool_calls == (0 if policy == "off" else 1)


@pytest.mark.parametrize("question", ["Break the tool.", "What time is it in Tokyo?"])
def test_a_repaired_call_is_the_same_with_overlap(
    loaded: LoadedModel, question: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A call no grammar held fails and is re-decoded under the grammar: the going back discards the chained step.
    body: JsonBody = {"messages": [user(question)], "tools": [GET_WEATHER_TOOL], "auto_tool_grammar": False}
    (outcome,), on = _same_with_and_without(loaded, PLAIN, lambda: {0: [task(body)]}, monkeypatch, rewinds=True)
    assert on.chained_steps > 0
    assert_ended(outcome)


def _lazy_grammar_pushed(text: str) -> Processors:
    """The request's own lazy "auto" grammar, after a push towards `text`."""

    def pushed(context: EngineContext, one: GenerationTask) -> RequestProcessors:
        tools = RequestTools.of(one.params.tool_policy)
        spec = constraint_spec(tools, None, context.tool_format, None, auto_grammar=True)
        assert spec is not None
        grammar = make_logits_processor(context.loaded.tokenizer, spec, prompt_length=0)
        return RequestProcessors((push_text(context.loaded, text),), (grammar,))

    return pushed


PARIS_CALL = qwen_tool_call_text("get_weather", '{"city": "Paris"}')


def test_the_lazy_grammar_before_and_after_its_trigger_is_the_same_with_overlap(
    loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Free text first (the lazy grammar not yet triggered: its mask allows any token), then a call it holds to the
    # schema: every step of both is chained, the mask computed while the forward pass runs.
    body: JsonBody = {"messages": [user("What is the weather in Paris?")], "tools": [GET_WEATHER_TOOL]}
    pushed = _lazy_grammar_pushed("Let me look that up. " + PARIS_CALL)
    (outcome,), on = _same_with_and_without(loaded, PLAIN, lambda: {0: [task(body)]}, monkeypatch, processors=pushed)
    finish = assert_ended(outcome)
    assert outcome.text.startswith("Let me look that up.")
    assert [chunk.name for chunk in outcome.chunks if isinstance(chunk, ToolCallChunk)] == ["get_weather"]
    assert on.chained_grammar_steps == on.chained_steps >= finish.usage.completion_tokens - 2


@pytest.mark.parametrize("shape", ["call", "tool_choice required", "tool_choice named", "response_format"])
def test_fast_forward_under_overlap_gives_the_same_answer(
    loaded: LoadedModel, shape: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Forced tokens after a token are known once it is read: the chained step feeds that token alone, and the step
    # after it is launched serially with the rest of the forced tokens (fast-forward one token later).
    (outcome,), on = _same_with_and_without(loaded, FAST_FORWARD, lambda: {0: [task(SHAPES[shape])]}, monkeypatch)
    assert on.drafted > 0  # forced tokens were still fed as drafts
    assert on.chained_grammar_steps > 0
    (plain,), _ = _same_with_and_without(loaded, PLAIN, lambda: {0: [task(SHAPES[shape])]}, monkeypatch)
    assert outcome.normalised() == plain.normalised()


@pytest.mark.parametrize("policy", ["answer", "block", "off"])
def test_the_loop_guards_take_back_under_the_lazy_grammar_is_the_same_with_overlap(
    loaded: LoadedModel, policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The repeated call is written under the lazy grammar on chained steps; the guard takes it back (the chained
    # step after the token that settles it is discarded before the grammar sees that token).
    body: JsonBody = {"messages": PARIS_LOOP, "tools": [GET_WEATHER_TOOL], "loop_guard": policy, "max_tokens": 24}
    for settings in (PLAIN, FAST_FORWARD):
        (outcome,), on = _same_with_and_without(
            loaded,
            settings,
            lambda: {0: [task(body)]},
            monkeypatch,
            processors=_lazy_grammar_pushed(PARIS_CALL),
            rewinds=True,
        )
        assert on.chained_grammar_steps > 0
        finish = assert_ended(outcome)
        assert finish.usage.withdrawn_tool_calls == (0 if policy == "off" else 1)


Spy = TypeVar("Spy")


def _off_and_on(
    loaded: LoadedModel,
    arrivals: Arrivals,
    monkeypatch: pytest.MonkeyPatch,
    spy: Callable[[pytest.MonkeyPatch], Spy],
) -> tuple[dict[bool, _Run], dict[bool, Spy]]:
    """`arrivals` run with overlap off then on, each under its own `spy` (installed for that run only)."""
    runs: dict[bool, _Run] = {}
    spies: dict[bool, Spy] = {}
    for overlap in (False, True):
        with pytest.MonkeyPatch.context() as spying:
            spies[overlap] = spy(spying)
            runs[overlap] = _run(
                loaded,
                PLAIN.model_copy(update={"overlap": overlap}),
                arrivals,
                monkeypatch,
            )
    return runs, spies


class _GrammarFeeds:
    """The tokens each admitted constrained request's processors were shown (the last of each call's context), and
    the request, to compare with what it generated."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.shown: dict[int, list[int]] = {}
        self.requests: list[ChatRequest] = []
        call = RequestProcessors.__call__
        admit = GenerationScheduler.admit

        def shown(processors: RequestProcessors, tokens: mx.array, logits: mx.array) -> mx.array:
            self.shown.setdefault(id(processors), []).append(cast(int, tokens[-1].item()))
            return call(processors, tokens, logits)

        def admitted(scheduler: GenerationScheduler, request: ChatRequest) -> None:
            self.requests.append(request)
            admit(scheduler, request)

        monkeypatch.setattr(RequestProcessors, "__call__", shown)
        monkeypatch.setattr(GenerationScheduler, "admit", admitted)

    def fed(self) -> list[tuple[list[int], list[int]]]:
        """Per constrained request, in arrival order: the tokens its grammar was fed after the prompt, and the tokens
        it generated."""
        return [
            (self.shown[id(request.processors)][1:], list(request.generated))
            for request in self.requests
            if request.processors.constrained
        ]


def _batched(*shapes: str) -> Arrivals:
    return lambda: {0: [task(SHAPES[shape]) for shape in shapes]}


BATCHES = {
    "required + plain": ("tool_choice required", "greeting"),
    "named + json_schema + penalty": ("tool_choice named", "response_format", "repetition penalty"),
    "lazy auto + required + json_schema + seeded": ("call", "tool_choice required", "response_format", "top_k"),
    "parallel calls + stop + named + max_tokens": (
        "parallel calls",
        "stop sequence",
        "tool_choice named",
        "max_tokens",
    ),
}


@pytest.mark.parametrize("shapes", list(BATCHES.values()), ids=list(BATCHES))
def test_a_batch_with_constrained_members_is_the_same_with_overlap(
    loaded: LoadedModel, shapes: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The requests prefill together and decode in one batch: each step with a constrained member launches the forward
    # pass before the masks, which are computed once the step's tokens were accepted (and the ended members left).
    runs, spies = _off_and_on(loaded, _batched(*shapes), monkeypatch, _GrammarFeeds)
    feeds = {overlap: spy.fed() for overlap, spy in spies.items()}
    off, on = runs[False], runs[True]
    assert [outcome.normalised() for outcome in on.outcomes] == [outcome.normalised() for outcome in off.outcomes]
    assert on.held == off.held
    assert off.batch_grammar_steps == off.batch_grammar_joins == 0
    assert on.batch_grammar_joins >= 1  # a prompt read sooner joins first, the others join it
    finishes = [assert_ended(outcome) for outcome in on.outcomes]
    constrained = [finish for finish, shape in zip(finishes, shapes, strict=True) if shape not in UNCONSTRAINED]
    # Every batch step but the joining one (mlx-lm's own) had its masks computed while its forward pass ran.
    assert on.batch_grammar_steps >= max(finish.usage.completion_tokens for finish in constrained) - 2 > 0
    # With overlap off each grammar is fed every token its request sampled, the one that ended it too (the step after
    # it was built before the request read it); with overlap on it is fed the same tokens but that last one.
    assert len(feeds[True]) == len(feeds[False]) == len(constrained)
    for (fed_on, generated), (fed_off, _) in zip(feeds[True], feeds[False], strict=True):
        assert fed_on == fed_off[:-1]
        assert fed_on == generated[: len(fed_on)]
        assert len(fed_on) in (len(generated), len(generated) - 1)


@pytest.mark.parametrize("step", [3, 8])
def test_a_constrained_member_cancelled_mid_batch_is_the_same_with_overlap(
    loaded: LoadedModel, step: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The named call is cancelled while it and the others decode in the batch; the others finish as before.
    shapes = ("tool_choice required", "tool_choice named", "response_format", "greeting")

    def cancel(arrivals: Mapping[int, Sequence[GenerationTask]]) -> dict[int, list[TaskId]]:
        return {step: [arrivals[0][1].task_id]}

    outcomes, on = _same_with_and_without(loaded, PLAIN, _batched(*shapes), monkeypatch, cancel_at=cancel)
    assert on.batch_grammar_steps > 0
    cancelled = outcomes[1]
    assert cancelled.chunks
    assert not any(chunk.model_dump().get("finish_reason") for chunk in cancelled.chunks)
    for index in (0, 2, 3):
        assert_ended(outcomes[index])


def test_a_member_ending_while_constrained_ones_continue_is_the_same_with_overlap(
    loaded: LoadedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 5-token reply under the lazy grammar ends by its length and a greeting by its end of turn while the
    # structured answer and the named call decode on in the batch, which keeps launching before the masks.
    shapes = ("max_tokens", "response_format", "tool_choice named", "greeting")
    outcomes, on = _same_with_and_without(loaded, PLAIN, _batched(*shapes), monkeypatch)
    finishes = [assert_ended(outcome) for outcome in outcomes]
    assert finishes[0].finish_reason == "length"
    assert finishes[0].usage.completion_tokens == 5
    longest = max(finish.usage.completion_tokens for finish in finishes[1:3])
    assert longest > finishes[3].usage.completion_tokens > 5
    assert on.batch_grammar_steps >= longest - 2


JOIN_STEP = 6
"""When the newcomers arrive: the first requests' prompts are in and they decode in the batch."""
JOINS = {
    "json_schema joins required + named": (("tool_choice required", "tool_choice named"), ("response_format",)),
    "required + lazy auto join json_schema + plain": (
        ("response_format", "greeting"),
        ("tool_choice required", "call"),
    ),
    "named joins json_schema + penalty": (("response_format", "repetition penalty"), ("tool_choice named",)),
}


def _joining(first: Sequence[str], newcomers: Sequence[str], *, at: int = JOIN_STEP) -> Arrivals:
    return lambda: {
        0: [task(SHAPES[shape]) for shape in first],
        at: [task(SHAPES[shape]) for shape in newcomers],
    }


class _JoinOrder:
    """Per scheduler step, in order: each batch settle that launched a sample, each read of joining members' first
    tokens that found some, and each filter of mlx-lm's prompt batch (its `split` filters, which waits for the
    passes in flight)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.steps: list[list[str]] = []
        step, settle, take_joined = GenerationScheduler.step, LazyLogprobsBatch.settle, LazyLogprobsBatch.take_joined
        prompt_filter = PromptProcessingBatch.filter

        def filtering(batch: PromptProcessingBatch, keep: list[int]) -> None:
            self.steps[-1].append("prompts filtered")
            prompt_filter(batch, keep)

        monkeypatch.setattr(PromptProcessingBatch, "filter", filtering)

        def stepping(scheduler: GenerationScheduler) -> list[RequestUpdate]:
            self.steps.append([])
            return step(scheduler)

        def settling(batch: LazyLogprobsBatch) -> bool:
            settled = settle(batch)
            if settled:
                self.steps[-1].append("settled")
            return settled

        def taking(batch: LazyLogprobsBatch) -> list[tuple[int, int]]:
            joined = take_joined(batch)
            if joined:
                self.steps[-1].append("joined")
            return joined

        monkeypatch.setattr(GenerationScheduler, "step", stepping)
        monkeypatch.setattr(LazyLogprobsBatch, "settle", settling)
        monkeypatch.setattr(LazyLogprobsBatch, "take_joined", taking)


@pytest.mark.parametrize(("first", "newcomers"), list(JOINS.values()), ids=list(JOINS))
def test_constrained_members_joining_a_running_batch_are_the_same_with_overlap(
    loaded: LoadedModel, first: tuple[str, ...], newcomers: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first requests decode in the batch when the newcomers' prompts are in: a newcomer's first forward pass is
    # launched before its processors compute its first mask (from its prompt alone), then masked and sampled.
    runs, spies = _off_and_on(
        loaded, _joining(first, newcomers), monkeypatch, lambda spying: (_GrammarFeeds(spying), _JoinOrder(spying))
    )
    feeds = {overlap: grammar_feeds.fed() for overlap, (grammar_feeds, _) in spies.items()}
    order = spies[True][1].steps
    off, on = runs[False], runs[True]
    assert [outcome.normalised() for outcome in on.outcomes] == [outcome.normalised() for outcome in off.outcomes]
    assert on.held == off.held
    assert off.batch_grammar_joins == 0
    # The first requests joining the empty batch together, then the newcomers joining them.
    assert on.batch_grammar_joins == (2 if any(shape not in UNCONSTRAINED for shape in first) else 1)
    for outcome in on.outcomes:
        assert_ended(outcome)
    # In the step the newcomers join a running constrained batch, the running members' masks are computed (and their
    # sample launched) before the newcomers' first tokens are read: while the two passes run.
    sampled = [[event for event in step if event != "prompts filtered"] for step in order]
    assert ["settled", "joined"] in sampled
    assert ["joined", "settled"] not in sampled
    # Nothing on the way waits for the running members' pass: the newcomers move on without a filter of the prompts.
    assert not any("prompts filtered" in step for step in order)
    # Each grammar was fed its own request's tokens (a mask computed for another row would have fed it another's).
    for fed_on, generated in feeds[True]:
        assert fed_on == generated[: len(fed_on)]
        assert len(fed_on) in (len(generated), len(generated) - 1)


@pytest.mark.parametrize("step", [JOIN_STEP + 1, JOIN_STEP + 2, JOIN_STEP + 4])
def test_a_constrained_newcomer_cancelled_as_it_joins_is_the_same_with_overlap(
    loaded: LoadedModel, step: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The newcomer is cancelled as its prompt is read, in the step it joins, or a few tokens after.
    first, newcomers = ("tool_choice required", "response_format"), ("tool_choice named",)

    def cancel(arrivals: Mapping[int, Sequence[GenerationTask]]) -> dict[int, list[TaskId]]:
        return {step: [arrivals[JOIN_STEP][0].task_id]}

    outcomes, on = _same_with_and_without(loaded, PLAIN, _joining(first, newcomers), monkeypatch, cancel_at=cancel)
    assert on.batch_grammar_steps > 0
    assert not any(chunk.model_dump().get("finish_reason") for chunk in outcomes[2].chunks)
    for index in (0, 1):
        assert_ended(outcomes[index])


@pytest.mark.parametrize("settings", [FAST_FORWARD, DecodeSettings(speculation=LookupSettings(adaptive=False))])
def test_a_speculating_request_joining_a_batch_is_the_same_with_overlap(
    loaded: LoadedModel, settings: DecodeSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The structured answer decodes alone and verifies drafts; the named call arrives, and the answer moves into the
    # batch with its cache (joining it under its grammar, at the state it reached alone) beside the newcomer; when
    # one ends, the other moves back out to speculate alone.
    outcomes, on = _same_with_and_without(
        loaded, settings, _joining(("response_format",), ("response_format",), at=2), monkeypatch
    )
    assert on.drafted > 0
    assert on.chained_grammar_steps > 0  # alone, under its grammar
    assert on.batch_grammar_joins >= 1
    for outcome in outcomes:
        assert_ended(outcome)


def _looping_on_paris(policy: str) -> tuple[JsonBody, Processors]:
    """A request about to repeat its Paris call under `policy`'s loop guard, and its processors: the lazy grammar
    already pushed into the call (other requests keep their own)."""
    body: JsonBody = {"messages": PARIS_LOOP, "tools": [GET_WEATHER_TOOL], "loop_guard": policy, "max_tokens": 24}
    lazy_pushed = _lazy_grammar_pushed(PARIS_CALL)

    def pushed(context: EngineContext, one: GenerationTask) -> RequestProcessors | None:
        return lazy_pushed(context, one) if one.params.messages[-1].content == PARIS_WEATHER_RESULT else None

    return body, pushed


@pytest.mark.parametrize("policy", ["answer", "block"])
def test_the_loop_guards_take_back_in_a_batch_rejoins_the_same_with_overlap(
    loaded: LoadedModel, policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The looping request writes its repeated call under the lazy grammar in a batch beside a structured answer; the
    # guard takes the call back, the request leaves the batch and joins it again from before the call.
    body, pushed = _looping_on_paris(policy)

    outcomes, on = _same_with_and_without(
        loaded,
        PLAIN,
        lambda: {0: [task(body), task(SHAPES["tool_choice required"])]},
        monkeypatch,
        processors=pushed,
        rewinds=True,
    )
    finishes = [assert_ended(outcome) for outcome in outcomes]
    assert finishes[0].usage.withdrawn_tool_calls == 1
    assert on.batch_grammar_joins >= 2  # together into the batch, then the looping request again


def _same_beside_or_not(
    loaded: LoadedModel,
    settings: DecodeSettings,
    arrivals: Arrivals,
    monkeypatch: pytest.MonkeyPatch,
    **options: Unpack[_Options],
) -> _Run:
    """Run the same requests with overlap on, each step's tokens accepted by the loop after the next launch, then on
    the helper thread while it launches: the chunks and the caches handed back are the same."""
    loop, beside = _compared(
        loaded,
        (
            settings.model_copy(update={"overlap": True, "accept_beside": False}),
            settings.model_copy(update={"overlap": True, "accept_beside": True}),
        ),
        arrivals,
        monkeypatch,
        **options,
    )
    assert loop.accepted_beside == 0
    assert beside.accepted_beside > 0
    assert beside.chained_steps == loop.chained_steps
    return beside


@pytest.mark.skipif(not launch_computes_on_host(), reason="the helper is used where steps compute on the CPU only")
@pytest.mark.parametrize(
    "arrivals",
    [
        pytest.param(lambda: {0: [task(body) for body in SHAPES.values()]}, id="every shape in one batch"),
        pytest.param(lambda: {0: [task(COPYING)], 3: [task(SHAPES["tool_choice required"])]}, id="alone then joined"),
        pytest.param(_joining(("response_format",), ("tool_choice named", "greeting")), id="constrained newcomers"),
    ],
)
def test_tokens_accepted_beside_the_launch_give_the_same_answers(
    loaded: LoadedModel, arrivals: Arrivals, monkeypatch: pytest.MonkeyPatch
) -> None:
    for settings in (PLAIN, DecodeSettings(speculation=LookupSettings(adaptive=False))):
        outcomes = _same_beside_or_not(loaded, settings, arrivals, monkeypatch).outcomes
        for outcome in outcomes:
            assert_ended(outcome)


@pytest.mark.skipif(not launch_computes_on_host(), reason="the helper is used where steps compute on the CPU only")
@pytest.mark.parametrize("step", [2, 5, JOIN_STEP + 1])
def test_a_cancel_with_tokens_accepted_beside_is_the_same(
    loaded: LoadedModel, step: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    def cancel(arrivals: Mapping[int, Sequence[GenerationTask]]) -> dict[int, list[TaskId]]:
        return {step: [arrivals[0][0].task_id]}

    _same_beside_or_not(
        loaded,
        PLAIN,
        _joining(("greeting", "response_format"), ("tool_choice required",)),
        monkeypatch,
        cancel_at=cancel,
    )


@pytest.mark.skipif(not launch_computes_on_host(), reason="the helper is used where steps compute on the CPU only")
@pytest.mark.parametrize("policy", ["answer", "block"])
def test_the_loop_guards_take_back_with_tokens_accepted_beside_is_the_same(
    loaded: LoadedModel, policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    body, pushed = _looping_on_paris(policy)

    for arrivals in (lambda: {0: [task(body)]}, lambda: {0: [task(body), task(SHAPES["tool_choice required"])]}):
        beside = _same_beside_or_not(loaded, PLAIN, arrivals, monkeypatch, processors=pushed, rewinds=True)
        assert assert_ended(beside.outcomes[0]).usage.withdrawn_tool_calls == 1
