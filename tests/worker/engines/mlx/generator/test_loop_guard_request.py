"""The loop guard on one chat request of the tiny-qwen-tools fixture: the reply (the model's own tokens for a call
it has already made and been answered) goes through the real request path — detokenizer, tool parser, grammar,
finish. `warn` reports the repeat without changing one chunk of the reply, `off` reports nothing; `answer` and
`block` take a real loop (the third identical call in a row after identical results) back before any of it is sent
and go on under a grammar without calls (`answer`) or without that tool (`block`), and let every other repeat
through. Where a reply cannot go without a call (a forced tool_choice), the loop is sent as the model wrote it and
reported: the guard never writes a call the model did not."""

import json
import math

import mlx.core as mx
import pytest
from pydantic import JsonValue

from exo.shared.types.chunks import Chunk, FinishChunk, TokenChunk, ToolCallArgumentsChunk, ToolCallChunk
from exo.shared.types.worker.decode_settings import DecodeSettings
from exo.worker.engines.mlx.generator.chat_completion import ChatRequest
from exo.worker.engines.mlx.generator.request_context import EngineContext
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


# A real loop: the same call twice in a row, the same result twice; a third is withdrawn.
LOOP: list[JsonValue] = [
    user(QUESTION),
    *_answered("Paris", "call_0", PARIS_WEATHER_RESULT),
    *_answered("Paris", "call_1", PARIS_WEATHER_RESULT),
]
# What goes through: a second identical call, calls in between, a result that changed, an error, the user asking.
SECOND: list[JsonValue] = [user(QUESTION), *_answered("Paris", "call_0", PARIS_WEATHER_RESULT)]
PING_PONG: list[JsonValue] = [
    user(QUESTION),
    *_answered("Paris", "call_0", PARIS_WEATHER_RESULT),
    *_answered("Tokyo", "call_1", TOKYO_RESULT),
    *_answered("Paris", "call_2", PARIS_WEATHER_RESULT),
]
CHANGED: list[JsonValue] = [
    user(QUESTION),
    *_answered("Paris", "call_0", PARIS_WEATHER_RESULT),
    *_answered("Paris", "call_1", PARIS_WEATHER_RESULT.replace("18", "19")),
]
ERROR = "Error: the weather service timed out"
AFTER_ERRORS: list[JsonValue] = [
    user(QUESTION),
    *_answered("Paris", "call_0", ERROR),
    *_answered("Paris", "call_1", ERROR),
]
ASKED_AGAIN: list[JsonValue] = [*LOOP, user("Run it again")]


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


def test_answer_withdraws_a_real_loop_and_the_reply_goes_on_without_calls(context: EngineContext) -> None:
    request = _answer_request(context, LOOP)
    lead = _encode(context, "Checking.\n")
    sent = request.accept([*lead, *_encode(context, REPEAT)])
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
    assert "without calls" in finish.loop_warnings[0]
    assert 'get_weather({"city":"Paris"})' in finish.loop_warnings[0]
    assert finish.usage.repeated_tool_calls == finish.usage.withdrawn_tool_calls == 1
    assert finish.usage.completion_tokens == len(request.generated)


LEGITIMATE = [
    (LOOP, NEW),
    (SECOND, REPEAT),
    (PING_PONG, REPEAT),
    (PING_PONG, OSLO),
    (CHANGED, REPEAT),
    (AFTER_ERRORS, REPEAT),
    (ASKED_AGAIN, REPEAT),
]


@pytest.mark.parametrize("policy", ["answer", "block"])
@pytest.mark.parametrize(("messages", "reply"), LEGITIMATE)
def test_every_repeat_but_a_real_loop_goes_through(
    context: EngineContext, messages: list[JsonValue], reply: str, policy: str
) -> None:
    request = _answer_request(context, messages, policy)
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


def test_block_withdraws_a_real_loop_and_the_reply_goes_on_without_that_tool(context: EngineContext) -> None:
    request = _answer_request(context, LOOP, policy="block")
    lead = _encode(context, "Checking.\n")
    assert _calls_in(request.accept([*lead, *_encode(context, REPEAT)])) == []
    assert request.take_rewind() == len(lead)
    # The tool offered is the looping one, so no call is left: the grammar of tool_choice "none".
    assert not _allows_a_call(context, request, lead)
    chunks = [*request.accept([*_encode(context, "Done."), *context.loaded.tokenizer.eos_token_ids])]
    finish = _finish([*chunks, *request.finish(None)])
    assert finish.finish_reason == "stop"
    assert finish.usage.withdrawn_tool_calls == 1
    assert "withdrawn" in finish.loop_warnings[0]


# ---- the guard never writes a call; the finish reason matches the message ------------------------------------------


@pytest.mark.parametrize("policy", ["answer", "block"])
@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_call_is_sent_as_the_model_wrote_it_and_reported(
    context: EngineContext, policy: str, tool_choice: JsonValue
) -> None:
    """Issue 37: a forced tool_choice with a repeat got a call the model never wrote (the grammar kept it from closing
    its string) and finish_reason "stop" beside it. Now the forced reply keeps the model's own call and says why."""
    body: dict[str, JsonValue] = {
        "messages": LOOP,
        "tools": [GET_WEATHER_TOOL],
        "tool_choice": tool_choice,
        "loop_guard": policy,
    }
    request = ChatRequest.open(context, task(body), rewinds=True)
    # Under a forced choice the grammar writes the opening marker; the model writes the rest.
    reply = _encode(context, REPEAT)
    chunks = [*request.accept([*reply, *context.loaded.tokenizer.eos_token_ids]), *request.finish(None)]
    assert request.take_rewind() is None
    arguments = "".join(chunk.fragment for chunk in chunks if isinstance(chunk, ToolCallArgumentsChunk))
    assert _calls_in(chunks) == ["get_weather"]
    assert json.loads(arguments) == {"city": "Paris"}
    finish = _finish(chunks)
    assert finish.finish_reason == "tool_calls"
    assert finish.usage.withdrawn_tool_calls == 0
    assert any("not withdrawn" in warning and "tool_choice" in warning for warning in finish.loop_warnings)


@pytest.mark.parametrize("messages", [SECOND, LOOP])
def test_a_forced_repeat_is_not_steered_by_the_grammar(context: EngineContext, messages: list[JsonValue]) -> None:
    """The processors of a forced call under `block` are those without the guard: no exclusion of the exact
    arguments reaches the grammar, so the tokens the model picks are the tokens it would pick anyway."""
    forced: dict[str, JsonValue] = {
        "messages": messages,
        "tools": [GET_WEATHER_TOOL],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    }
    guarded = ChatRequest.open(context, task({**forced, "loop_guard": "block"}), rewinds=True)
    unguarded = ChatRequest.open(context, task({**forced, "loop_guard": "off"}), rewinds=True)
    reply = _encode(context, REPEAT)
    for end in range(len(reply) + 1):
        tokens = mx.array([*guarded.prefill_tokens, *reply[:end]])
        logits = mx.zeros((1, context.loaded.vocabulary_size))
        assert mx.array_equal(guarded.processors(tokens, logits), unguarded.processors(tokens, logits)).item()


@pytest.mark.parametrize("policy", ["answer", "block"])
def test_a_withdrawn_call_written_again_after_a_near_miss_ends_the_reply_instead_of_going_back_again(
    context: EngineContext, policy: str
) -> None:
    """Going back under the grammar without calls, a model may still write the withdrawn call after a near miss of
    the marker (`<toolcall>`: ordinary text the grammar lets through, which the parser reads as a call). Going back
    to the same place again would decode the same tokens again, for ever: the reply ends before the call instead."""
    request = _answer_request(context, LOOP, policy)
    lead = _encode(context, "Checking.\n")
    assert _calls_in(request.accept([*lead, *_encode(context, REPEAT)])) == []
    assert request.take_rewind() == len(lead)
    near_miss = '<toolcall>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</toolcall>'
    sent = request.accept(_encode(context, near_miss))
    chunks = [*sent, *request.finish(None)]
    assert request.take_rewind() is None
    assert _calls_in(chunks) == []
    assert request.generated == lead
    finish = _finish(chunks)
    assert finish.finish_reason == "stop"
    assert finish.usage.withdrawn_tool_calls == 2
    assert "the reply ended there" in finish.loop_warnings[-1]
    # The reply kept its own text, so no notice was added to it.
    text = "".join(chunk.text for chunk in chunks if isinstance(chunk, TokenChunk))
    assert "exo loop guard" not in text


@pytest.mark.parametrize("policy", ["answer", "block"])
def test_a_reply_that_was_only_withdrawn_calls_says_so_in_its_text(context: EngineContext, policy: str) -> None:
    """A reply whose every call was withdrawn, with no text of its own, would reach the user empty (seen with
    opencode and the 0.5B model): its text is the guard's notice instead, naming the call and why."""
    request = _answer_request(context, LOOP, policy)
    assert _calls_in(request.accept(_encode(context, REPEAT))) == []
    assert request.take_rewind() == 0
    near_miss = '<toolcall>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</toolcall>'
    chunks = [*request.accept(_encode(context, near_miss)), *request.finish(None)]
    assert _calls_in(chunks) == []
    assert request.generated == []
    text = "".join(chunk.text for chunk in chunks if isinstance(chunk, TokenChunk))
    assert text.startswith("[exo loop guard: repeated call get_weather(")
    assert "the model wrote no other answer" in text
    finish = _finish(chunks)
    assert finish.finish_reason == "stop"
    assert finish.usage.withdrawn_tool_calls == 2
    assert finish.loop_warnings[-1] in text
