"""The loop guard's `answer` on every decoder of the scheduler (tiny-qwen-tools fixture, real forward passes): a
model pushed to write a third time the call whose identical result the conversation holds twice (standing in for a
model stuck in an agent loop) gets that call taken back before any of it is streamed, and its reply goes on without
calls; the same push towards the same tool with new arguments gets its call through untouched. Alone, speculating
and in a batch beside another request, the reply is the same, and the request beside it keeps its own."""

import pytest
from pydantic import JsonValue

from exo.shared.types.chunks import TokenChunk, ToolCallArgumentsChunk, ToolCallChunk
from exo.shared.types.common import TaskId
from exo.shared.types.tasks import GenerationTask
from exo.shared.types.worker.decode_settings import DecodeSettings, LookupSettings
from exo.tool_calls.grammar.policy import RequestTools, constraint_spec
from exo.worker.engines.mlx.constrained import make_logits_processor
from exo.worker.engines.mlx.generator.chat_completion import ChatRequest
from exo.worker.engines.mlx.generator.processors import RequestProcessors
from exo.worker.engines.mlx.generator.request_context import EngineContext
from exo.worker.engines.mlx.generator.scheduler import GenerationScheduler
from tests.fixtures.fixture_specs import (
    FIXTURE_MODELS_DIR,
    GET_WEATHER_TOOL,
    PARIS_WEATHER_ANSWER,
    qwen_tool_call_text,
    user,
)
from tests.worker.engines.mlx.generator.scheduling import (
    MAX_STEPS,
    PARIS_LOOP,
    Outcome,
    assert_ended,
    engine_context,
    push_text,
    run,
    task,
    with_settings,
)

PARIS = qwen_tool_call_text("get_weather", '{"city": "Paris"}')
TOKYO = qwen_tool_call_text("get_weather", '{"city": "Tokyo"}')


@pytest.fixture(scope="module")
def context() -> EngineContext:
    return engine_context(FIXTURE_MODELS_DIR / "tiny-qwen-tools", DecodeSettings(speculation=None))


def _pushed(context: EngineContext, one: GenerationTask, text: str) -> RequestProcessors:
    """The request's own lazy grammar, after a push towards `text`."""
    spec = constraint_spec(RequestTools.of(one.params.tool_policy), None, context.tool_format, None, auto_grammar=True)
    assert spec is not None
    grammar = make_logits_processor(context.loaded.tokenizer, spec, prompt_length=0)
    return RequestProcessors((push_text(context.loaded, text),), (grammar,))


def _task(policy: str) -> GenerationTask:
    body: dict[str, JsonValue] = {
        "messages": PARIS_LOOP,
        "tools": [GET_WEATHER_TOOL],
        "loop_guard": policy,
        "max_tokens": 24,
    }
    return task(body)


def _run(context: EngineContext, pushed: str, policy: str, beside: GenerationTask | None = None) -> Outcome:
    one = _task(policy)
    arriving = [one] if beside is None else [one, beside]
    processors: dict[TaskId, RequestProcessors] = {one.task_id: _pushed(context, one, pushed)}
    return run(context, {0: arriving}, processors=processors, rewinds=True)[one.task_id]


def _calls(outcome: Outcome) -> list[tuple[str, str]]:
    calls: list[tuple[str, str]] = []
    for chunk in outcome.chunks:
        if isinstance(chunk, ToolCallChunk):
            calls.append((chunk.name, ""))
        elif isinstance(chunk, ToolCallArgumentsChunk):
            calls[chunk.index] = (calls[chunk.index][0], calls[chunk.index][1] + chunk.fragment)
    return calls


def test_the_pushed_repeat_is_written_without_the_guard(context: EngineContext) -> None:
    # The push reproduces the loop: with the guard off, the answered call comes back.
    assert _calls(_run(context, PARIS, "off"))[:1] == [("get_weather", '{"city": "Paris"}')]


def test_answer_takes_the_repeat_back_on_every_decoder(context: EngineContext) -> None:
    alone = _run(context, PARIS, "answer")
    finish = assert_ended(alone)
    # No piece of the call reached the stream (no call header, no argument fragment): the model answered from the
    # result it already had, as the fixture was trained to after a tool result.
    assert _calls(alone) == []
    assert alone.text == PARIS_WEATHER_ANSWER
    assert finish.finish_reason == "stop"
    assert finish.usage.withdrawn_tool_calls == 1
    assert any("withdrawn" in warning for warning in finish.loop_warnings)

    speculating = with_settings(context, DecodeSettings(speculation=LookupSettings()))
    assert _run(speculating, PARIS, "answer").normalised() == alone.normalised()

    beside = task({"messages": [user("What is the weather in Paris and Tokyo?")], "tools": [GET_WEATHER_TOOL]})
    beside_alone = run(context, {0: [beside]})[beside.task_id]
    one = _task("answer")
    processors = {one.task_id: _pushed(context, one, PARIS)}
    together = run(context, {0: [one, beside]}, processors=processors, rewinds=True)
    assert together[one.task_id].normalised() == alone.normalised()
    assert together[beside.task_id].normalised() == beside_alone.normalised()


def test_answer_lets_the_same_tool_with_new_arguments_through(context: EngineContext) -> None:
    outcome = _run(context, TOKYO, "answer")
    finish = assert_ended(outcome)
    assert _calls(outcome)[:1] == [("get_weather", '{"city": "Tokyo"}')]
    assert finish.usage.withdrawn_tool_calls == 0
    assert outcome.normalised()[:-1] == _run(context, TOKYO, "off").normalised()[:-1]


def test_a_withdrawal_counts_in_the_usage_of_a_request_then_cancelled(context: EngineContext) -> None:
    # The reply is cancelled once the answer's first words are out, after the guard took the repeat back: the usage
    # the runner reports for the cancel (what /metrics counts) still holds the withdrawal.
    one = _task("answer")
    request = ChatRequest.open(context, one, rewinds=True)
    request.processors = _pushed(context, one, PARIS)
    scheduler = GenerationScheduler(context.loaded.model, context.decode)
    scheduler.admit(request)
    text = ""
    for _ in range(MAX_STEPS):
        for update in scheduler.step():
            assert not update.done
            text += "".join(chunk.text for chunk in update.chunks if isinstance(chunk, TokenChunk))
        if text:
            break
    assert text
    assert PARIS_WEATHER_ANSWER.startswith(text)
    usage = scheduler.cancel(one.task_id)
    assert usage is not None
    assert usage.withdrawn_tool_calls == 1
    assert usage.repeated_tool_calls >= 1
    assert usage.completion_tokens == len(request.generated) > 0
    assert scheduler.cancel(one.task_id) is None
