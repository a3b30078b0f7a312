"""The loop guard on one chat request of the tiny-qwen-tools fixture: the reply (the model's own tokens for a call
it has already made and been answered) goes through the real request path — detokenizer, tool parser, finish — and
`warn` reports the repeat without changing one chunk of the reply, `off` reports nothing."""

import pytest
from pydantic import JsonValue

from exo.shared.types.chunks import Chunk, FinishChunk
from exo.worker.engines.mlx.generator.chat_completion import ChatRequest, DecodeSettings, EngineContext
from tests.fixtures.fixture_specs import (
    FIXTURE_MODELS_DIR,
    GET_WEATHER_TOOL,
    PARIS_WEATHER_RESULT,
    assistant_tool_call,
    qwen_tool_call_text,
    tool_result,
    user,
)
from tests.worker.engines.mlx.generator.scheduling import engine_context, task

REPEAT = qwen_tool_call_text("get_weather", '{"city": "Paris"}')
NEW = qwen_tool_call_text("get_weather", '{"city": "Tokyo"}')


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
