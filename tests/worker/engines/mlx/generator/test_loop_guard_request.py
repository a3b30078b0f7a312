"""The loop guard on one chat request of the tiny-qwen-tools fixture: the reply (the model's own tokens for a call
it has already made and been answered) goes through the real request path — detokenizer, tool parser, grammar,
finish. `warn` reports the repeat without changing one chunk of the reply, `off` reports nothing, and `answer`
takes the repeat back before any of it is sent and goes on under a grammar that forbids calls."""

import math

import mlx.core as mx
import pytest
from pydantic import JsonValue

from exo.shared.types.chunks import Chunk, FinishChunk, TokenChunk, ToolCallChunk
from exo.worker.engines.mlx.generator.chat_completion import ChatRequest, DecodeSettings, EngineContext
from tests.fixtures.fixture_specs import (
    FIXTURE_MODELS_DIR,
    GET_WEATHER_TOOL,
    PARIS_WEATHER_ANSWER,
    PARIS_WEATHER_RESULT,
    assistant_tool_call,
    qwen_tool_call_text,
    tool_result,
    user,
)
from tests.worker.engines.mlx.generator.scheduling import engine_context, task

REPEAT = qwen_tool_call_text("get_weather", '{"city": "Paris"}')
NEW = qwen_tool_call_text("get_weather", '{"city": "Tokyo"}')
OSLO = qwen_tool_call_text("get_weather", '{"city": "Oslo"}')


@pytest.fixture(scope="module")
def context() -> EngineContext:
    return engine_context(FIXTURE_MODELS_DIR / "tiny-qwen-tools", DecodeSettings(speculation=None))


def _reply(context: EngineContext, policy: str, text: str) -> list[Chunk]:
    body: dict[str, JsonValue] = {
        "messages": [
            user("What is the weather in Paris?"),
            assistant_tool_call("get_weather", {"city": "Paris"}),
            tool_result(PARIS_WEATHER_RESULT),
            user("And now?"),
        ],
        "tools": [GET_WEATHER_TOOL],
        "loop_guard": policy,
    }
    request = ChatRequest.open(context, task(body))
    tokens: list[int] = context.loaded.tokenizer.encode(text, add_special_tokens=False)
    chunks = request.accept(tokens)
    return [*chunks, *request.finish(None)]


def _finish(chunks: list[Chunk]) -> FinishChunk:
    finish = chunks[-1]
    assert isinstance(finish, FinishChunk)
    return finish


def test_warn_reports_a_repeated_call_and_changes_nothing_else(context: EngineContext) -> None:
    off, warned = _reply(context, "off", REPEAT), _reply(context, "warn", REPEAT)
    assert _finish(off).loop_warnings == ()
    assert _finish(off).usage.repeated_tool_calls == 0
    assert len(_finish(warned).loop_warnings) == 1
    assert "get_weather" in _finish(warned).loop_warnings[0]
    assert _finish(warned).usage.repeated_tool_calls == 1
    # Every chunk but the finish is the same (calls get fresh ids, so compare them without).
    strip = [chunk.model_dump(exclude={"call_id"}) for chunk in off[:-1]]
    assert [chunk.model_dump(exclude={"call_id"}) for chunk in warned[:-1]] == strip
    assert _finish(warned).finish_reason == _finish(off).finish_reason == "tool_calls"


def test_a_call_with_new_arguments_is_no_repeat(context: EngineContext) -> None:
    assert _finish(_reply(context, "warn", NEW)).loop_warnings == ()


# ---- answer: a repeat is withdrawn and the reply goes on without calls --------------------------------------------

QUESTION = "What is the weather in Paris?"
TOKYO_RESULT = '{"city": "Tokyo", "temperature": 21, "condition": "cloudy"}'


def _answered(city: str, call_id: str, result: str) -> list[JsonValue]:
    return [assistant_tool_call("get_weather", {"city": city}, call_id), tool_result(result, call_id)]


LOOP: list[JsonValue] = [user(QUESTION), *_answered("Paris", "call_0", PARIS_WEATHER_RESULT)]
PING_PONG: list[JsonValue] = [
    user(QUESTION),
    *_answered("Tokyo", "call_0", TOKYO_RESULT),
    *_answered("Paris", "call_1", PARIS_WEATHER_RESULT),
    *_answered("Tokyo", "call_2", TOKYO_RESULT),
]
# The user spoke after the answered call: asking for it again is no loop.
ASKED_AGAIN: list[JsonValue] = [*LOOP, {"role": "assistant", "content": PARIS_WEATHER_ANSWER}, user(QUESTION)]


def _answer_request(context: EngineContext, messages: list[JsonValue], policy: str = "answer") -> ChatRequest:
    body: dict[str, JsonValue] = {"messages": messages, "tools": [GET_WEATHER_TOOL], "loop_guard": policy}
    return ChatRequest.open(context, task(body), rewinds=True)


def _encode(context: EngineContext, text: str) -> list[int]:
    return context.loaded.tokenizer.encode(text, add_special_tokens=False)


def _calls_in(chunks: list[Chunk]) -> list[str]:
    return [chunk.name for chunk in chunks if isinstance(chunk, ToolCallChunk)]


def _allows_a_call(context: EngineContext, request: ChatRequest, reply: list[int]) -> bool:
    """Whether the request's processors let the next token open a call (`<tool_call>`) after `reply`."""
    opening = _encode(context, "<tool_call>")[0]
    tokens = mx.array([*request.prefill_tokens, *reply])
    logits = request.processors(tokens, mx.zeros((1, context.loaded.vocabulary_size)))
    allowed: float = logits[0, opening].item()  # pyright: ignore[reportAssignmentType] -- a float logit
    return allowed > -math.inf


@pytest.mark.parametrize(("messages", "repeat"), [(LOOP, REPEAT), (PING_PONG, REPEAT)])
def test_answer_withdraws_a_repeated_call_and_the_reply_goes_on_without_calls(
    context: EngineContext, messages: list[JsonValue], repeat: str
) -> None:
    request = _answer_request(context, messages)
    lead = _encode(context, "Checking.\n")
    sent = request.accept([*lead, *_encode(context, repeat)])
    # The call was held while it was written and never sent; the reply went back to where it began.
    assert _calls_in(sent) == []
    assert request.take_rewind() == len(lead)
    assert request.generated == lead
    # From there the reply is decoded under the grammar of tool_choice "none": no call can open any more.
    assert request.processors.constrained
    assert not _allows_a_call(context, request, lead)
    sent += request.accept([*_encode(context, PARIS_WEATHER_ANSWER), *context.loaded.tokenizer.eos_token_ids])
    chunks = [*sent, *request.finish(None)]
    assert _calls_in(chunks) == []
    text = "".join(chunk.text for chunk in chunks if isinstance(chunk, TokenChunk))
    assert text == "Checking.\n" + PARIS_WEATHER_ANSWER
    finish = _finish(chunks)
    assert finish.finish_reason == "stop"
    assert len(finish.loop_warnings) == 1
    assert "withdrawn" in finish.loop_warnings[0]
    assert 'get_weather({"city":"Paris"})' in finish.loop_warnings[0]
    assert finish.usage.repeated_tool_calls == finish.usage.withdrawn_tool_calls == 1
    assert finish.usage.completion_tokens == len(request.generated)


@pytest.mark.parametrize(("messages", "reply"), [(LOOP, NEW), (ASKED_AGAIN, REPEAT), (PING_PONG, OSLO)])
def test_answer_leaves_a_new_call_and_a_call_the_user_asked_for_again_alone(
    context: EngineContext, messages: list[JsonValue], reply: str
) -> None:
    request = _answer_request(context, messages)
    chunks = [*request.accept(_encode(context, reply)), *request.finish(None)]
    assert request.take_rewind() is None
    unguarded = _answer_request(context, messages, policy="off")
    expected = [*unguarded.accept(_encode(context, reply)), *unguarded.finish(None)]
    strip = [chunk.model_dump(exclude={"call_id", "loop_warnings", "usage"}) for chunk in expected]
    assert [chunk.model_dump(exclude={"call_id", "loop_warnings", "usage"}) for chunk in chunks] == strip
    assert _calls_in(chunks) == ["get_weather"]
    assert _finish(chunks).usage.withdrawn_tool_calls == 0


def test_answer_ends_the_reply_before_a_repeat_that_follows_a_new_call(context: EngineContext) -> None:
    request = _answer_request(context, LOOP)
    sent = request.accept(_encode(context, NEW + "\n" + REPEAT))
    chunks = [*sent, *request.finish(None)]
    # The new call is sent; the repeat after it is not, and the reply ends where it began.
    assert request.take_rewind() is None
    assert _calls_in(chunks) == ["get_weather"]
    assert _finish(chunks).finish_reason == "tool_calls"
    assert _finish(chunks).usage.withdrawn_tool_calls == 1
    assert request.generated == _encode(context, NEW + "\n")


def test_answer_goes_back_to_before_an_opening_marker_spelled_in_pieces(context: EngineContext) -> None:
    # `<tool_call>` written as ordinary pieces, not its added token: the call begins where its first piece does, so
    # the reply goes back to before "<tool_call", which the grammar without calls would not let it keep.
    request = _answer_request(context, LOOP)
    lead = _encode(context, "Checking.\n")
    pieces = _encode(context, "<tool_call")
    assert len(pieces) > 1
    rest = _encode(context, REPEAT.removeprefix("<tool_call"))
    assert _calls_in(request.accept([*lead, *pieces, *rest])) == []
    assert request.take_rewind() == len(lead)
    assert not _allows_a_call(context, request, lead)
