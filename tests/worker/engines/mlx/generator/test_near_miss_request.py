"""A call written after a near miss of `<tool_call>` (`<toolcall>`, ordinary text pieces, not the marker's added
token), through the real request path of the tiny-qwen-tools fixture: its Qwen tokenizer, the detokenizer, the tool
parser, the lazy grammar of `tool_choice: auto`, the finish. The reply's tokens are the tokenizer's own for the text,
accepted one at a time as the decoder hands them over."""

import json

import pytest
from pydantic import JsonValue

from exo.shared.types.chunks import Chunk, FinishChunk, TokenChunk, ToolCallArgumentsChunk, ToolCallChunk
from exo.shared.types.worker.decode_settings import DecodeSettings
from exo.worker.engines.mlx.generator.chat_completion import ChatRequest
from exo.worker.engines.mlx.generator.request_context import EngineContext
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR, GET_WEATHER_TOOL, user
from tests.worker.engines.mlx.generator.scheduling import engine_context, task

CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


@pytest.fixture(scope="module")
def context() -> EngineContext:
    return engine_context(FIXTURE_MODELS_DIR / "tiny-qwen-tools", DecodeSettings(speculation=None))


def _reply(context: EngineContext, text: str, *, offered: bool = True) -> list[Chunk]:
    body: dict[str, JsonValue] = {"messages": [user("What is the weather in Paris?")]}
    if offered:
        body["tools"] = [GET_WEATHER_TOOL]
    request = ChatRequest.open(context, task(body))
    tokens: list[int] = context.loaded.tokenizer.encode(text, add_special_tokens=False)
    chunks = [chunk for token in tokens for chunk in request.accept([token])]
    return [*chunks, *request.finish(None)]


def _content(chunks: list[Chunk]) -> str:
    return "".join(chunk.text for chunk in chunks if isinstance(chunk, TokenChunk))


def _calls(chunks: list[Chunk]) -> list[tuple[str, JsonValue]]:
    names = [chunk.name for chunk in chunks if isinstance(chunk, ToolCallChunk)]
    arguments = "".join(chunk.fragment for chunk in chunks if isinstance(chunk, ToolCallArgumentsChunk))
    return [(name, json.loads(arguments)) for name in names]


def _finish_reason(chunks: list[Chunk]) -> str:
    finish = chunks[-1]
    assert isinstance(finish, FinishChunk)
    return finish.finish_reason


def test_the_near_miss_is_spelled_in_ordinary_pieces(context: EngineContext) -> None:
    tokenizer = context.loaded.tokenizer
    assert len(tokenizer.encode("<toolcall>", add_special_tokens=False)) > 1
    assert tokenizer.encode("<tool_call>", add_special_tokens=False) == [tokenizer.convert_tokens_to_ids("<tool_call>")]


@pytest.mark.parametrize("opening", ["<toolcall>", "<toolCall>", "<tool-call>", "<function_call>"])
def test_a_call_after_a_near_miss_is_a_call(context: EngineContext, opening: str) -> None:
    chunks = _reply(context, f"{opening}\n{CALL}\n</toolcall>")
    assert _calls(chunks) == [("get_weather", {"city": "Paris"})]
    assert _content(chunks) == ""
    assert _finish_reason(chunks) == "tool_calls"


def test_prose_that_mentions_the_near_miss_is_content_unchanged(context: EngineContext) -> None:
    text = "Write <toolcall> then the call object."
    chunks = _reply(context, text)
    assert _calls(chunks) == []
    assert _content(chunks) == text
    assert _finish_reason(chunks) == "stop"


def test_with_no_tools_offered_a_near_miss_call_is_content(context: EngineContext) -> None:
    text = f"<toolcall>\n{CALL}\n</toolcall>"
    chunks = _reply(context, text, offered=False)
    assert _calls(chunks) == []
    assert _content(chunks) == text
