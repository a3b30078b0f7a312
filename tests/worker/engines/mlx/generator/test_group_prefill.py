"""Prompts that arrive together are prefilled together: a piece of each in one batched pass, so they reach their
first token together instead of one after another, with the answers they get alone.

Real forward passes of the fixture models through the runner's GenerationScheduler. Timing-free: what is asserted
is which step each request's first token came in and what the scheduler counted, never how long anything took.
"""

import pytest

from exo.shared.types.chunks import Chunk
from exo.shared.types.common import TaskId, new_task_id
from exo.shared.types.tasks import GenerationTask
from exo.shared.types.worker.decode_settings import DecodeSettings
from exo.worker.engines.mlx.generator import group_prefill
from exo.worker.engines.mlx.generator.chat_completion import ChatRequest
from exo.worker.engines.mlx.generator.request_context import EngineContext
from exo.worker.engines.mlx.generator.scheduler import GenerationScheduler
from tests.fixtures.fixture_specs import (
    FIXTURE_MODELS_DIR,
    GET_WEATHER_TOOL,
    GREETING_REPLY,
    PARIS_WEATHER_RESULT,
    assistant_tool_call,
    tool_result,
    user,
)
from tests.worker.engines.mlx.generator.scheduling import (
    MAX_STEPS,
    JsonBody,
    Outcome,
    assert_ended,
    engine_context,
    run,
    run_alone,
    task,
)

EIGHT = DecodeSettings(batch_size=8)
GREETING: JsonBody = {"messages": [user("Hello!")]}
MIXED: list[JsonBody] = [
    GREETING,
    {"messages": [user("What is the weather in Paris?")], "tools": [GET_WEATHER_TOOL]},
    {**GREETING, "tools": [GET_WEATHER_TOOL], "tool_choice": "required", "max_tokens": 40},
    {"messages": [user("What is the weather in Paris and Tokyo?")], "tools": [GET_WEATHER_TOOL]},
    {"messages": [user("Hi there, who are you?")], "max_tokens": 24},
    {"messages": [user("What is the weather in Tokyo?")], "tools": [GET_WEATHER_TOOL], "tool_choice": "none"},
    {"messages": [user("Hello! What can you do?")], "max_tokens": 24},
    {**GREETING, "stop": ["help"]},
]


def first_token_steps(
    context: EngineContext, tasks: list[GenerationTask], scheduler: GenerationScheduler
) -> dict[TaskId, int]:
    """All `tasks` admitted before the first step; the step each one's first generated token came in."""
    for one in tasks:
        scheduler.admit(ChatRequest.open(context, one))
    first: dict[TaskId, int] = {}
    for step in range(MAX_STEPS):
        for update in scheduler.step():
            if update.generated_tokens > 0 and update.task_id not in first:
                first[update.task_id] = step
        if scheduler.active == 0:
            return first
    raise AssertionError(f"still running after {MAX_STEPS} steps")


@pytest.fixture(scope="module")
def qwen() -> EngineContext:
    return engine_context(FIXTURE_MODELS_DIR / "tiny-qwen-tools", EIGHT)


def test_eight_requests_arriving_together_are_prefilled_in_one_batch_and_start_together(qwen: EngineContext) -> None:
    scheduler = GenerationScheduler(qwen.loaded.model, qwen.decode)
    tasks = [task(GREETING) for _ in range(8)]  # one prompt: every piece of every member is the same length

    first = first_token_steps(qwen, tasks, scheduler)

    assert scheduler.prefill_stats.largest_group == 8
    assert scheduler.prefill_stats.grouped_pieces == scheduler.prefill_stats.pieces  # no prompt was fed alone
    assert scheduler.prefill_stats.by_prompts == {8: scheduler.prefill_stats.pieces}  # what /metrics shows
    assert len(first) == 8
    assert len(set(first.values())) == 1, first  # one after another, they would start at least a step apart


def test_prompts_of_different_lengths_are_fed_side_by_side(qwen: EngineContext) -> None:
    scheduler = GenerationScheduler(qwen.loaded.model, qwen.decode)
    tasks = [task(body) for body in MIXED]
    prompt_lengths = [len(ChatRequest.open(qwen, one).prefill_tokens) for one in tasks]
    assert len(set(prompt_lengths)) > 2  # the control: prompts of several lengths

    first = first_token_steps(qwen, tasks, scheduler)

    assert scheduler.prefill_stats.largest_group == 8
    assert len(first) == 8
    # Each grouped piece feeds every prompt still prefilling, so no request waits for another's whole prompt: the
    # first tokens come within as many steps as there were pieces, not one request's prefill after another's.
    assert max(first.values()) - min(first.values()) <= scheduler.prefill_stats.pieces


@pytest.mark.parametrize("model", ["tiny-qwen-tools", "tiny-llama31-tools", "tiny-qwen-agent"])
@pytest.mark.parametrize("members", [4, 8])
def test_requests_prefilled_together_get_their_alone_answers(model: str, members: int) -> None:
    context = engine_context(FIXTURE_MODELS_DIR / model, EIGHT)
    bodies = MIXED[:members]
    alone = [run_alone(context, task(body)) for body in bodies]
    tasks = [task(body) for body in bodies]
    scheduler = GenerationScheduler(context.loaded.model, context.decode)

    together = run(context, {0: tasks}, scheduler=scheduler)

    assert scheduler.prefill_stats.largest_group == members
    for index, one in enumerate(tasks):
        assert_ended(together[one.task_id])
        assert together[one.task_id].normalised() == alone[index].normalised(), bodies[index]


def test_a_member_cancelled_during_a_grouped_piece_leaves_the_others_intact() -> None:
    # A piece pauses at every layer boundary, so a grouped piece spans several steps and the cancel lands inside it.
    settings = DecodeSettings(batch_size=8, prefill_piece_seconds=1e-6)
    context = engine_context(FIXTURE_MODELS_DIR / "tiny-qwen-tools", settings, prefix_cache_bytes=1 << 24)
    tasks = [task(GREETING) for _ in range(4)]
    cancelled = tasks[1]
    scheduler = GenerationScheduler(context.loaded.model, context.decode)

    together = run(context, {0: tasks}, cancel_at={1: [cancelled.task_id]}, scheduler=scheduler)

    # The piece was still running at the cancel: the cancelled member got no progress and left it; the other three
    # were fed by it.
    assert together[cancelled.task_id].chunks == []
    assert scheduler.prefill_stats.largest_group == 3
    for one in tasks:
        if one is not cancelled:
            assert together[one.task_id].text == GREETING_REPLY
    assert scheduler.active == 0


def test_without_batching_prompts_are_still_prefilled_one_at_a_time() -> None:
    # The control for the step assertions above: a model that cannot batch (batch size 1) feeds prompts alone.
    context = engine_context(FIXTURE_MODELS_DIR / "tiny-qwen-tools", DecodeSettings(batch_size=1))
    scheduler = GenerationScheduler(context.loaded.model, context.decode)
    tasks = [task(GREETING) for _ in range(3)]

    outcomes = run(context, {0: tasks}, scheduler=scheduler)

    assert scheduler.prefill_stats.grouped_pieces == 0
    assert scheduler.prefill_stats.pieces >= 3
    assert scheduler.prefill_stats.by_prompts == {1: scheduler.prefill_stats.pieces}
    assert all(outcome.text == GREETING_REPLY for outcome in outcomes.values())


def test_requests_whose_whole_prompt_is_cached_start_together() -> None:
    context = engine_context(FIXTURE_MODELS_DIR / "tiny-qwen-tools", EIGHT, prefix_cache_bytes=1 << 24)
    assert run_alone(context, task(GREETING)).text == GREETING_REPLY  # fills the prefix cache
    tasks = [task(GREETING) for _ in range(4)]
    assert all(len(ChatRequest.open(context, one).prefill_tokens) == 1 for one in tasks)  # nothing left to feed
    scheduler = GenerationScheduler(context.loaded.model, context.decode)

    first = first_token_steps(context, tasks, scheduler)

    assert scheduler.prefill_stats.pieces == 0
    assert len(first) == 4
    assert len(set(first.values())) == 1, first  # none waited for the one before it to leave the prefill queue


def test_a_prompt_with_a_long_cached_prefix_is_not_grouped_with_cold_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    # Grouping pads every member's cache to the longest; with a small bound, the follow-up turn (its first turn in
    # the prefix cache) is fed alone and the cold prompts together.
    monkeypatch.setattr(group_prefill, "MAX_CONTEXT_PADDING", 8)
    context = engine_context(FIXTURE_MODELS_DIR / "tiny-qwen-tools", EIGHT, prefix_cache_bytes=1 << 24)
    first_turn: JsonBody = {"messages": [user("What is the weather in Paris?")], "tools": [GET_WEATHER_TOOL]}
    reply = assert_ended(run_alone(context, task(first_turn)))
    follow_up = task(
        {
            "messages": [
                user("What is the weather in Paris?"),
                assistant_tool_call("get_weather", {"city": "Paris"}),
                tool_result(PARIS_WEATHER_RESULT),
            ],
            "tools": [GET_WEATHER_TOOL],
            "max_tokens": 8,
        }
    )
    cold = [task({"messages": [user(f"Hello number {n}!")], "max_tokens": 8}) for n in range(3)]
    scheduler = GenerationScheduler(context.loaded.model, context.decode)

    outcomes = run(context, {0: [follow_up, *cold]}, scheduler=scheduler)

    assert reply.usage.prompt_tokens > 8
    assert assert_ended(outcomes[follow_up.task_id]).usage.cached_tokens >= reply.usage.prompt_tokens - 1
    assert scheduler.prefill_stats.largest_group == 3  # the three cold prompts, not the cached follow-up
    for one in cold:
        assert assert_ended(outcomes[one.task_id]).usage.completion_tokens > 0


def test_a_request_joining_a_running_batch_gets_its_first_token_in_the_step_its_prompt_is_in(
    qwen: EngineContext,
) -> None:
    # The batch samples a newcomer's first token in the pass that joins it; it is handed out in that step, not one
    # batch step later. A one-token request ends on it, and leaves the batch with the answer it gets alone.
    scheduler = GenerationScheduler(qwen.loaded.model, qwen.decode)
    running = [task(GREETING), task(GREETING)]
    joining = [
        task({"messages": [user("Hello! What can you do?")], "max_tokens": 24}),
        task({"messages": [user("Hi there, who are you?")], "max_tokens": 1}),
    ]
    alone = {one.task_id: run_alone(qwen, _same(one)) for one in joining}
    for one in running:
        scheduler.admit(ChatRequest.open(qwen, one))
    last_prefill: dict[TaskId, int] = {}
    first: dict[TaskId, int] = {}
    chunks: dict[TaskId, list[Chunk]] = {one.task_id: [] for one in joining}
    admitted = False
    for step in range(MAX_STEPS):
        if not admitted and all(one.task_id in first for one in running):
            for one in joining:  # the two running ones decode in a batch by now
                scheduler.admit(ChatRequest.open(qwen, one))
            admitted = True
        for update in scheduler.step():
            if update.task_id in chunks:
                chunks[update.task_id] += update.chunks
                if update.generated_tokens == 0:
                    last_prefill[update.task_id] = step
            if update.generated_tokens > 0 and update.task_id not in first:
                first[update.task_id] = step
        if scheduler.active == 0:
            break

    for one in joining:
        assert first[one.task_id] > first[running[0].task_id]  # it joined a batch that was already decoding
        assert first[one.task_id] == last_prefill[one.task_id], (first, last_prefill)
        assert Outcome(chunks[one.task_id]).normalised() == alone[one.task_id].normalised()
    assert assert_ended(Outcome(chunks[joining[1].task_id])).usage.completion_tokens == 1


def _same(one: GenerationTask) -> GenerationTask:
    """Another task with the same request (a task id is used once)."""
    return one.model_copy(update={"task_id": new_task_id()})


@pytest.mark.parametrize(("apart", "expected"), [(0, {1: 1, 2: 1}), (1, {1: 3})])
def test_prompts_joining_a_decoding_request_are_each_counted_once(
    qwen: EngineContext, apart: int, expected: dict[int, int]
) -> None:
    # What /metrics shows as exo_prefill_pieces_total{prompts}: one request decodes, then two join it, admitted in
    # the same step (fed together: one piece of 2) or a step apart (each fed alone). Every short prompt is fed in one
    # piece, so 2 pieces for 3 prompts is right when two were fed together; the prompts fed are the sum of
    # prompts x pieces.
    scheduler = GenerationScheduler(qwen.loaded.model, qwen.decode)
    first = task({"messages": [user("Hello! Count to 0.")], "max_tokens": 24})
    joining = [task({"messages": [user(f"Hello! Count to {n}.")], "max_tokens": 24}) for n in (1, 2)]
    scheduler.admit(ChatRequest.open(qwen, first))
    admit_at: list[tuple[int, GenerationTask]] = []
    decoding_from: int | None = None
    for step in range(MAX_STEPS):
        if decoding_from is None and scheduler.decoding == 1:
            decoding_from = step
            admit_at = [(step, joining[0]), (step + apart, joining[1])]
        for one in [one for at, one in admit_at if at == step]:
            scheduler.admit(ChatRequest.open(qwen, one))
        admit_at = [(at, one) for at, one in admit_at if at > step]
        scheduler.step()
        if scheduler.active == 0 and decoding_from is not None and not admit_at:
            break

    assert decoding_from is not None
    assert scheduler.prefill_stats.by_prompts == expected
    assert sum(prompts * pieces for prompts, pieces in scheduler.prefill_stats.by_prompts.items()) == 3
