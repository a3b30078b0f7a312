"""History with tool calls renders through the fixture models' real chat templates, whatever shape clients send."""

from pathlib import Path

import pytest

from exo.api.adapters.chat_request import normalise_messages
from exo.api.types.openai_chat import ChatCompletionRequest
from exo.shared.types.tasks import ToolPolicy
from exo.shared.types.tool_spec import ToolSpec
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.chat_template import apply_chat_template
from exo.worker.engines.mlx.loaded_model import LoadedModel
from exo.worker.engines.mlx.model_loader import load_model
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR, GET_WEATHER_TOOL, JsonObject

WEATHER = ToolPolicy(tools=(ToolSpec.model_validate(GET_WEATHER_TOOL["function"]),))


@pytest.fixture(scope="module")
def qwen() -> LoadedModel:
    return load_model(Path(FIXTURE_MODELS_DIR / "tiny-qwen-tools"), ShardAssignment())


def render(loaded: LoadedModel, calls: list[JsonObject], content: object = None) -> str:
    body = {
        "messages": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": content, "tool_calls": calls},
            *({"role": "tool", "tool_call_id": call["id"], "content": "sunny"} for call in calls),
        ]
    }
    messages = normalise_messages(ChatCompletionRequest.model_validate(body).messages)
    return apply_chat_template(loaded.tokenizer, messages, WEATHER).text


def call(arguments: str | JsonObject, call_id: str = "call_1") -> JsonObject:
    return {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}


@pytest.mark.parametrize("arguments", ['{"city":"Paris"}', '{"city": "Paris"}', {"city": "Paris"}])
def test_string_and_object_arguments_render_the_same(qwen: LoadedModel, arguments: str | JsonObject) -> None:
    assert render(qwen, [call(arguments)]) == render(qwen, [call({"city": "Paris"})])


@pytest.mark.parametrize("content", [None, ""])
def test_null_and_empty_assistant_content_render_the_same(qwen: LoadedModel, content: object) -> None:
    assert render(qwen, [call({"city": "Paris"})], content) == render(qwen, [call({"city": "Paris"})], None)


def test_arguments_that_are_not_json_are_kept_as_the_model_wrote_them(qwen: LoadedModel) -> None:
    # e.g. a call cut off by max_tokens that the agent sends back: accepted (as OpenAI does), never dropped.
    rendered = render(qwen, [call('{"city": "Par')])
    assert "Par" in rendered
    assert rendered.count("<tool_call>") >= 1


def test_parallel_calls_render_in_order(qwen: LoadedModel) -> None:
    rendered = render(qwen, [call({"city": "Paris"}, "call_1"), call({"city": "Tokyo"}, "call_2")])
    assert rendered.index("Paris", rendered.index("<|im_start|>assistant")) < rendered.index("Tokyo")
