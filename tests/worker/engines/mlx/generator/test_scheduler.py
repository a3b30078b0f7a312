"""Continuous batching: requests that decode together each get exactly the answer they get alone.

Real forward passes of the tiny-qwen-tools fixture model through the runner's GenerationScheduler. Each request
shape carries its own per-request state into the batch: tools and tool_choice (a grammar), response_format (a
grammar), a seeded temperature, a penalty, stop sequences and max_tokens. A request decoding alone uses prompt-lookup
speculation, so "alone" and "together" also run different decoders.
"""

import mlx.core as mx
import pytest
from mlx import nn
from pydantic import JsonValue

from exo.shared.types.chunks import ErrorChunk
from exo.shared.types.tasks import GenerationTask
from exo.shared.types.worker.decode_settings import DecodeSettings, LookupSettings
from exo.worker.engines.mlx.cpu.matmul_plan import PlanSlot, RowChoice, ShapePlan
from exo.worker.engines.mlx.cpu.matmul_planner import install_plans
from exo.worker.engines.mlx.generator.processors import RequestProcessors
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
    JsonBody,
    Outcome,
    assert_ended,
    context_for,
    engine_context,
    run,
    run_alone,
    task,
)

FORECAST_SCHEMA: dict[str, JsonValue] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "temperature": {"type": "integer", "minimum": -50, "maximum": 50},
    },
    "required": ["city", "temperature"],
    "additionalProperties": False,
}
PARIS: JsonBody = {"messages": [user("What is the weather in Paris?")], "tools": [GET_WEATHER_TOOL]}
GREETING: JsonBody = {"messages": [user("Hello!")]}
SHAPES: dict[str, JsonBody] = {
    "greeting": GREETING,
    "call": PARIS,
    "parallel calls": {"messages": [user("What is the weather in Paris and Tokyo?")], "tools": [GET_WEATHER_TOOL]},
    "tool_choice required": {**GREETING, "tools": [GET_WEATHER_TOOL], "tool_choice": "required", "max_tokens": 40},
    "tool_choice named": {
        **PARIS,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": False,
    },
    "tool_choice none": {**PARIS, "tool_choice": "none"},
    "response_format": {
        **PARIS,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "forecast", "schema": FORECAST_SCHEMA, "strict": True},
        },
        "tool_choice": "none",
        "max_tokens": 60,
    },
    "seeded temperature": {**GREETING, "temperature": 2.0, "seed": 7},
    "same seed again": {**GREETING, "temperature": 2.0, "seed": 7},
    "top_k": {**GREETING, "temperature": 2.0, "seed": 3, "top_k": 1},
    "repetition penalty": {**GREETING, "repetition_penalty": 5.0},
    "stop sequence": {**GREETING, "stop": ["help"]},
    "max_tokens": {
        "messages": [
            user("What is the weather in Paris?"),
            assistant_tool_call("get_weather", {"city": "Paris"}),
            tool_result(PARIS_WEATHER_RESULT),
        ],
        "tools": [GET_WEATHER_TOOL],
        "max_tokens": 5,
    },
}
# Every draft verified when a request decodes alone, whatever the load makes multi-token passes cost.
BATCHED = DecodeSettings(batch_size=16, speculation=LookupSettings(adaptive=False))


@pytest.fixture(scope="module")
def context() -> EngineContext:
    return engine_context(FIXTURE_MODELS_DIR / "tiny-qwen-tools", BATCHED)


@pytest.fixture(scope="module")
def alone(context: EngineContext) -> dict[str, Outcome]:
    """Each shape's answer when it is the only request."""
    return {name: run_alone(context, task(body)) for name, body in SHAPES.items()}


def named_tasks() -> dict[str, GenerationTask]:
    return {name: task(body) for name, body in SHAPES.items()}


def test_the_request_shapes_are_distinct_answers(alone: dict[str, Outcome]) -> None:
    # The control for the batching tests: each knob changed the answer it was applied to.
    for outcome in alone.values():
        assert_ended(outcome)
    assert alone["greeting"].text == GREETING_REPLY
    assert alone["seeded temperature"].text != GREETING_REPLY
    assert alone["top_k"].text == GREETING_REPLY
    assert alone["repetition penalty"].text != GREETING_REPLY
    assert alone["stop sequence"].text == GREETING_REPLY[: GREETING_REPLY.index("help")]
    assert alone["tool_choice required"].text == ""
    assert alone["tool_choice none"].text != ""
    limited = assert_ended(alone["max_tokens"])
    assert (limited.finish_reason, limited.usage.completion_tokens) == ("length", 5)


def test_requests_arriving_together_each_get_their_alone_answer(
    context: EngineContext, alone: dict[str, Outcome]
) -> None:
    tasks = named_tasks()
    together = run(context, {0: list(tasks.values())})
    for name, one in tasks.items():
        assert together[one.task_id].normalised() == alone[name].normalised(), name


def test_requests_joining_and_leaving_a_running_batch_each_get_their_alone_answer(
    context: EngineContext, alone: dict[str, Outcome]
) -> None:
    # Staggered: the first request starts alone (speculating), the next ones arrive while it decodes and the batch
    # forms around it; later ones join a batch that others are leaving.
    tasks = named_tasks()
    arrivals: dict[int, list[GenerationTask]] = {}
    for index, one in enumerate(tasks.values()):
        arrivals.setdefault(index * 3, []).append(one)
    together = run(context, arrivals)
    for name, one in tasks.items():
        assert together[one.task_id].normalised() == alone[name].normalised(), name


def test_a_batch_member_left_alone_moves_out_to_speculate_with_the_same_answer(
    context: EngineContext, alone: dict[str, Outcome]
) -> None:
    short, long = task(SHAPES["stop sequence"]), task(SHAPES["parallel calls"])
    scheduler = GenerationScheduler(context.loaded.model, context.decode)
    together = run(context, {0: [short, long]}, scheduler=scheduler)
    assert together[short.task_id].normalised() == alone["stop sequence"].normalised()
    assert together[long.task_id].normalised() == alone["parallel calls"].normalised()
    assert scheduler.speculation.steps > 0  # the long one decoded alone once the short one was done


def test_a_cancelled_member_leaves_the_others_intact(context: EngineContext, alone: dict[str, Outcome]) -> None:
    tasks = named_tasks()
    cancelled = tasks["parallel calls"]
    together = run(context, {0: list(tasks.values())}, cancel_at={4: [cancelled.task_id]})
    got = together[cancelled.task_id].normalised()
    assert got == alone["parallel calls"].normalised()[: len(got)]
    assert len(got) < len(alone["parallel calls"].normalised())
    for name, one in tasks.items():
        if one is not cancelled:
            assert together[one.task_id].normalised() == alone[name].normalised(), name


def test_a_member_whose_processor_fails_fails_alone(context: EngineContext, alone: dict[str, Outcome]) -> None:
    calls = 0

    def breaks_on_the_third_token(tokens: mx.array, logits: mx.array) -> mx.array:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise RuntimeError(f"grammar exploded after {tokens.shape[0]} tokens")
        return logits

    tasks = named_tasks()
    broken = task(GREETING)
    together = run(
        context,
        {0: [broken, *tasks.values()]},
        processors={broken.task_id: RequestProcessors([breaks_on_the_third_token], ())},
    )
    failure = together[broken.task_id].last
    assert isinstance(failure, ErrorChunk)
    assert "grammar exploded" in failure.message
    for name, one in tasks.items():
        assert together[one.task_id].normalised() == alone[name].normalised(), name


def test_batched_requests_reuse_and_fill_the_prefix_cache() -> None:
    context = engine_context(FIXTURE_MODELS_DIR / "tiny-qwen-tools", BATCHED, prefix_cache_bytes=1 << 26)
    first_turn, greeting = task(PARIS), task(GREETING)
    first = run(context, {0: [first_turn, greeting]})
    assert assert_ended(first[first_turn.task_id]).usage.cached_tokens == 0
    # The next turn of the conversation, batched with another request: its prompt starts with the first turn's
    # prompt and reply, which the batch stored.
    follow_up = task(SHAPES["max_tokens"])
    again = task(GREETING)
    second = run(context, {0: [follow_up, again]})
    follow_up_usage = assert_ended(second[follow_up.task_id]).usage
    assert follow_up_usage.cached_tokens > 0
    assert (
        assert_ended(second[again.task_id]).usage.cached_tokens
        == assert_ended(first[greeting.task_id]).usage.prompt_tokens - 1
    )
    uncached = context_for(context.loaded, BATCHED)
    assert second[follow_up.task_id].normalised() == run_alone(uncached, task(SHAPES["max_tokens"])).normalised()


def test_with_every_product_planned_batched_and_speculating_requests_keep_their_answers(
    alone: dict[str, Outcome],
) -> None:
    # A plan that leaves mlx's own product for every row count (the other layout, padded by one row), so batches of
    # every size and every verification pass take the planned path; the answers are those of the unplanned model.
    planned = engine_context(FIXTURE_MODELS_DIR / "tiny-qwen-tools", BATCHED)
    shapes = {
        (module.weight.shape[0], module.weight.shape[1])
        for _, module in planned.loaded.model.named_modules()
        if type(module) in (nn.Linear, nn.Embedding)
    }
    rows = len(SHAPES) + 8
    every_row = ShapePlan(
        choices=tuple(RowChoice(layout="weights_first", computed_rows=count + 1) for count in range(1, rows + 1))
    )
    install_plans(planned.loaded.model, dict.fromkeys(shapes, PlanSlot(every_row)))
    tasks = named_tasks()

    together = run(planned, {0: list(tasks.values())})

    for name, one in tasks.items():
        assert together[one.task_id].normalised() == alone[name].normalised(), name
        assert run_alone(planned, task(SHAPES[name])).normalised() == alone[name].normalised(), name
