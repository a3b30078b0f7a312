"""`response_format` reaches the task as a typed StructuredOutput, or is refused with a 400 naming the problem."""

import pytest
from pydantic import JsonValue, ValidationError

from exo.api.adapters.chat_request import to_command
from exo.api.errors import ApiError
from exo.api.types.openai_chat import ChatCompletionRequest
from exo.shared.types.common import ModelId
from exo.shared.types.tasks import StructuredOutput

MODEL = ModelId("m")
MESSAGES = [{"role": "user", "content": "Hello!"}]
WEATHER_SCHEMA: dict[str, JsonValue] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
    "required": ["city"],
    "additionalProperties": False,
}


def structured_output(response_format: object) -> StructuredOutput | None:
    body = ChatCompletionRequest.model_validate({"messages": MESSAGES, "response_format": response_format})
    return to_command(body, MODEL).params.structured_output


def test_text_or_no_response_format_leaves_the_reply_free() -> None:
    assert structured_output({"type": "text"}) is None
    assert (
        to_command(ChatCompletionRequest.model_validate({"messages": MESSAGES}), MODEL).params.structured_output is None
    )


def test_json_object_asks_for_any_object() -> None:
    assert structured_output({"type": "json_object"}) == StructuredOutput(json_schema={"type": "object"})


@pytest.mark.parametrize(("strict", "expected"), [(True, True), (False, False), (None, False)])
def test_json_schema_carries_the_schema_and_strictness(strict: bool | None, expected: bool) -> None:
    spec = {"name": "weather", "description": "A city", "schema": WEATHER_SCHEMA, "strict": strict}
    assert structured_output({"type": "json_schema", "json_schema": spec}) == StructuredOutput(
        json_schema=WEATHER_SCHEMA, strict=expected
    )


@pytest.mark.parametrize(
    ("schema", "needle"),
    [
        ({"type": "objekt"}, "'objekt' is not valid under any of the given schemas"),
        ({"type": "object", "required": "city"}, "'city' is not of type 'array'"),
        ({"type": "object", "properties": {"n": {"minimum": "1"}}}, "'1' is not of type 'number'"),
    ],
)
def test_an_invalid_schema_is_a_400_naming_the_problem(schema: dict[str, object], needle: str) -> None:
    with pytest.raises(ApiError) as raised:
        structured_output({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert raised.value.status_code == 400
    assert raised.value.body.error.param == "response_format.json_schema.schema"
    assert "response_format.json_schema.schema is not a valid JSON Schema" in str(raised.value)
    assert needle in str(raised.value)


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "json_schema"},
        {"type": "json_schema", "json_schema": {"schema": WEATHER_SCHEMA}},
        {"type": "json_schema", "json_schema": {"name": "x"}},
        {"type": "yaml"},
    ],
)
def test_a_malformed_response_format_fails_validation(response_format: object) -> None:
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate({"messages": MESSAGES, "response_format": response_format})


def test_response_format_is_accepted_alongside_forced_tool_calls() -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_SCHEMA}}
    body = ChatCompletionRequest.model_validate(
        {"messages": MESSAGES, "tools": [tool], "tool_choice": "required", "response_format": {"type": "json_object"}}
    )
    params = to_command(body, MODEL).params
    assert params.tool_policy.mode == "required"
    assert params.structured_output == StructuredOutput(json_schema={"type": "object"})
