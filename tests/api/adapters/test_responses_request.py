"""Responses API requests become the same command a chat completion does; what cannot be honoured is a 400."""

from typing import Any

import pytest

from exo.api.adapters import chat_request, responses_request
from exo.api.errors import ApiError
from exo.api.types.openai_chat import ChatCompletionRequest
from exo.api.types.openai_responses import InputTokensRequest, ResponsesRequest
from exo.shared.types.common import ModelId
from exo.shared.types.tasks import GenerationParams, PromptMessage

MODEL = ModelId("tiny")
WEATHER_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": WEATHER_PARAMETERS,
    "strict": False,
}
TIME_TOOL: dict[str, Any] = {"type": "function", "name": "get_time", "parameters": None, "strict": None}


def params(**body: Any) -> GenerationParams:
    request = ResponsesRequest.model_validate({"model": MODEL, **body})
    return responses_request.to_command(request, MODEL).params


def refusal(**body: Any) -> ApiError:
    with pytest.raises(ApiError) as raised:
        params(**body)
    assert raised.value.status_code == 400
    return raised.value


def test_a_tool_conversation_normalises_exactly_as_the_equivalent_chat_request() -> None:
    responses = params(
        instructions="Be brief.",
        tools=[WEATHER_TOOL],
        input=[
            {"role": "developer", "content": "Use tools."},
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris and Rome?"}]},
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "Two calls."}],
            },
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city": "Rome"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "rain"}]},
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_1",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Sunny, then rain.", "annotations": []}],
            },
            {"role": "user", "content": "Thanks"},
        ],
    )
    chat = ChatCompletionRequest.model_validate(
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "developer", "content": "Use tools."},
                {"role": "user", "content": "Weather in Paris and Rome?"},
                {
                    "role": "assistant",
                    "content": "",
                    "reasoning_content": "Two calls.",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                        },
                        {
                            "id": "call_2",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                        },
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                {"role": "tool", "tool_call_id": "call_2", "content": "rain"},
                {"role": "assistant", "content": "Sunny, then rain."},
                {"role": "user", "content": "Thanks"},
            ],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "description": "Weather for a city.",
                        "parameters": WEATHER_PARAMETERS,
                        "strict": False,
                    },
                }
            ],
        }
    )
    expected = chat_request.to_command(chat, MODEL).params
    assert responses.messages == expected.messages
    assert responses.tool_policy == expected.tool_policy


def test_a_string_input_is_one_user_message() -> None:
    assert params(input="Hello!").messages == (PromptMessage(role="user", content="Hello!"),)


def test_function_tools_are_strict_unless_they_say_otherwise() -> None:
    tools = params(input="x", tools=[WEATHER_TOOL, TIME_TOOL]).tool_policy.tools
    assert [(tool.name, tool.strict) for tool in tools] == [("get_weather", False), ("get_time", True)]
    assert tools[1].parameters == {"type": "object", "properties": {}}


@pytest.mark.parametrize(
    ("choice", "parallel_tool_calls", "mode", "callable_tools", "parallel"),
    [
        (None, None, "auto", (), True),
        ("auto", False, "auto", (), False),
        ("required", None, "required", (), True),
        ("none", None, "none", (), True),
        ({"type": "function", "name": "get_time"}, None, "named", ("get_time",), False),
        (
            {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_time"}]},
            None,
            "required",
            ("get_time",),
            True,
        ),
    ],
)
def test_tool_choice_and_parallel_tool_calls_map_onto_the_engine_policy(
    choice: object, parallel_tool_calls: bool | None, mode: str, callable_tools: tuple[str, ...], parallel: bool
) -> None:
    extra: dict[str, Any] = {} if choice is None else {"tool_choice": choice}
    if parallel_tool_calls is not None:
        extra["parallel_tool_calls"] = parallel_tool_calls
    policy = params(input="x", tools=[WEATHER_TOOL, TIME_TOOL], **extra).tool_policy
    assert (policy.mode, policy.callable_tools, policy.parallel_tool_calls) == (mode, callable_tools, parallel)


@pytest.mark.parametrize(
    ("text_format", "schema", "strict"),
    [
        ({"type": "json_object"}, {"type": "object"}, False),
        (
            {
                "type": "json_schema",
                "name": "a",
                "schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
                "strict": True,
            },
            {"type": "object", "properties": {"a": {"type": "integer"}}},
            True,
        ),
    ],
)
def test_text_format_is_the_structured_output(
    text_format: dict[str, Any], schema: dict[str, Any], strict: bool
) -> None:
    structured = params(input="x", text={"format": text_format, "verbosity": "low"}).structured_output
    assert structured is not None
    assert (structured.json_schema, structured.strict) == (schema, strict)
    assert params(input="x", text={"format": {"type": "text"}}).structured_output is None


def test_sampling_and_reasoning_switch_are_mapped() -> None:
    mapped = params(input="x", max_output_tokens=50, temperature=0.5, top_p=0.9, reasoning={"effort": "none"})
    assert (mapped.sampling.max_tokens, mapped.sampling.temperature, mapped.sampling.top_p) == (50, 0.5, 0.9)
    assert mapped.chat_template_kwargs == {"enable_thinking": False}
    assert params(input="x", reasoning={"effort": "high", "summary": "auto"}).chat_template_kwargs == {}


@pytest.mark.parametrize(
    ("body", "param", "needle"),
    [
        ({"tools": [{"type": "web_search", "external_web_access": False}]}, "tools[0].type", "'web_search'"),
        ({"tools": [{"type": "namespace", "name": "agents", "tools": []}]}, "tools[0].type", "'namespace'"),
        ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice", "web_search_preview"),
        ({"tool_choice": "required"}, "tool_choice", "requires a non-empty tools list"),
        ({"previous_response_id": "resp_1"}, "previous_response_id", "keeps no responses"),
        ({"conversation": "conv_1"}, "conversation", "keeps no responses"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "item references"),
        ({"input": [{"type": "computer_call_output", "call_id": "c"}]}, "input[0].type", "computer_call_output"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0]",
            "input_image",
        ),
        (
            {"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]},
            "input[0].call_id",
            "does not match",
        ),
        (
            {"input": [{"type": "reasoning", "summary": [], "encrypted_content": "gAAA"}]},
            "input[0].encrypted_content",
            "encrypted",
        ),
        ({"input": []}, "input", "input is required"),
        ({"truncation": "auto"}, "truncation", "never cut"),
        ({"background": True}, "background", "background"),
        ({"top_logprobs": 2}, "top_logprobs", "logprobs"),
        ({"include": ["message.output_text.logprobs"]}, "include[0]", "logprobs"),
        ({"max_output_tokens": 0}, "max_output_tokens", "at least 1"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema", "required"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_the_field(body: dict[str, Any], param: str, needle: str) -> None:
    error = refusal(**{"input": "x", **body})
    assert error.body.error.param == param
    assert needle in error.body.error.message, error.body.error.message


def test_input_tokens_renders_the_same_prompt_and_generates_nothing() -> None:
    body = {"model": MODEL, "instructions": "s", "tools": [WEATHER_TOOL], "input": "x"}
    counted = responses_request.count_command(InputTokensRequest.model_validate(body), MODEL).params
    generated = params(**{key: value for key, value in body.items() if key != "model"})
    assert counted.count_prompt_only
    assert counted.messages == generated.messages
    assert counted.tool_policy == generated.tool_policy


def test_codex_request_is_accepted_as_sent() -> None:
    """The fields Codex CLI 0.169 sends on every turn (captured from its requests) all validate and map."""
    body = {
        "model": MODEL,
        "stream": True,
        "instructions": None,
        "input": [
            {
                "type": "message",
                "id": "msg_0",
                "role": "developer",
                "content": [{"type": "input_text", "text": "You are a coding agent."}],
            },
            {"type": "message", "id": "msg_1", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        ],
        "tools": [WEATHER_TOOL],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "01a208a5",
        "client_metadata": {"x-codex-installation-id": "b2e1"},
    }
    mapped = responses_request.to_command(ResponsesRequest.model_validate(body), MODEL).params
    assert mapped.messages == (
        PromptMessage(role="system", content="You are a coding agent."),
        PromptMessage(role="user", content="hi"),
    )
