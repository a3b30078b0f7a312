"""Messages API requests become the same command a chat completion does; what cannot be honoured is a 400."""

import json
from typing import Any

import pytest

from exo.api.adapters import chat_request, messages_request
from exo.api.errors import ApiError
from exo.api.types.anthropic_messages import CountTokensRequest, MessagesRequest
from exo.api.types.openai_chat import ChatCompletionRequest
from exo.shared.types.common import ModelId
from exo.shared.types.tasks import GenerationParams, PromptMessage

MODEL = ModelId("tiny")
WEATHER_TOOL: dict[str, Any] = {
    "name": "get_weather",
    "description": "Weather for a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
TIME_TOOL: dict[str, Any] = {"name": "get_time", "input_schema": {"type": "object", "properties": {}}}


def params(**body: Any) -> GenerationParams:
    request = MessagesRequest.model_validate({"model": MODEL, "max_tokens": 64, **body})
    return messages_request.to_command(request, MODEL).params


def refusal(**body: Any) -> ApiError:
    with pytest.raises(ApiError) as raised:
        params(**body)
    assert raised.value.status_code == 400
    return raised.value


def test_a_tool_conversation_normalises_exactly_as_the_equivalent_chat_request() -> None:
    anthropic = params(
        system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": " Use tools."}],
        tools=[WEATHER_TOOL],
        messages=[
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "rain"}]},
                ],
            },
        ],
    )
    chat = ChatCompletionRequest.model_validate(
        {
            "messages": [
                {"role": "system", "content": "Be brief. Use tools."},
                {"role": "user", "content": "Weather in Paris and Rome?"},
                {
                    "role": "assistant",
                    "content": "Checking.",
                    "tool_calls": [
                        {
                            "id": "toolu_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                        },
                        {
                            "id": "toolu_2",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": {"city": "Rome"}},
                        },
                    ],
                },
                {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
                {"role": "tool", "tool_call_id": "toolu_2", "content": "rain"},
            ],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        **{k: v for k, v in WEATHER_TOOL.items() if k != "input_schema"},
                        "parameters": WEATHER_TOOL["input_schema"],
                    },
                }
            ],
        }
    )
    expected = chat_request.to_command(chat, MODEL).params
    assert anthropic.messages == expected.messages
    assert anthropic.tool_policy == expected.tool_policy


def test_tool_results_come_before_the_text_of_the_same_user_turn_and_errors_are_marked() -> None:
    history = params(
        tools=[WEATHER_TOOL],
        messages=[
            {"role": "user", "content": "Paris?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>keep going</system-reminder>"},
                    {"type": "tool_result", "tool_use_id": "t1", "content": "city is required", "is_error": True},
                ],
            },
        ],
    ).messages
    assert [message.role for message in history] == ["user", "assistant", "tool", "user"]
    assert history[2] == PromptMessage(role="tool", content="Error: city is required", tool_call_id="t1")
    assert history[3].content == "<system-reminder>keep going</system-reminder>"


def test_thinking_blocks_become_reasoning_and_mid_conversation_system_turns_stay_in_place() -> None:
    history = params(
        messages=[
            {"role": "user", "content": "Hi"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Greet.", "signature": "x"},
                    {"type": "text", "text": "Hello!"},
                ],
            },
            {"role": "system", "content": "Now answer in French."},
            {"role": "user", "content": "Again"},
        ]
    ).messages
    assert history[1] == PromptMessage(role="assistant", content="Hello!", reasoning_content="Greet.")
    assert history[2] == PromptMessage(role="system", content="Now answer in French.")


@pytest.mark.parametrize(
    ("keep", "kept"),
    [
        (None, ["", "", "third"]),
        ("all", ["first", "second", "third"]),
        ({"type": "thinking_turns", "value": 2}, ["", "second", "third"]),
    ],
)
def test_clear_thinking_keeps_reasoning_of_the_latest_turns_only(keep: object, kept: list[str]) -> None:
    turns: list[dict[str, Any]] = []
    for thought in ("first", "second", "third"):
        turns += [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": [{"type": "thinking", "thinking": thought}, {"type": "text", "text": "ok"}],
            },
        ]
    edit: dict[str, Any] = {"type": "clear_thinking_20251015"} | ({} if keep is None else {"keep": keep})
    history = params(
        messages=[*turns, {"role": "user", "content": "go"}], context_management={"edits": [edit]}
    ).messages
    assert [message.reasoning_content or "" for message in history if message.role == "assistant"] == kept


@pytest.mark.parametrize(
    ("choice", "mode", "callable_tools", "parallel"),
    [
        (None, "auto", (), True),
        ({"type": "auto"}, "auto", (), True),
        ({"type": "auto", "disable_parallel_tool_use": True}, "auto", (), False),
        ({"type": "any"}, "required", (), True),
        ({"type": "tool", "name": "get_time"}, "required", ("get_time",), True),
        ({"type": "tool", "name": "get_time", "disable_parallel_tool_use": True}, "named", ("get_time",), False),
        ({"type": "none"}, "none", (), True),
    ],
)
def test_tool_choice_maps_onto_the_engine_policy(
    choice: dict[str, Any] | None, mode: str, callable_tools: tuple[str, ...], parallel: bool
) -> None:
    extra = {} if choice is None else {"tool_choice": choice}
    policy = params(tools=[WEATHER_TOOL, TIME_TOOL], messages=[{"role": "user", "content": "x"}], **extra).tool_policy
    assert (policy.mode, policy.callable_tools, policy.parallel_tool_calls) == (mode, callable_tools, parallel)
    assert [tool.name for tool in policy.tools] == ["get_weather", "get_time"]
    assert policy.tools[0].parameters == WEATHER_TOOL["input_schema"]


def test_sampling_thinking_switch_and_structured_output_are_mapped() -> None:
    mapped = params(
        messages=[{"role": "user", "content": "x"}],
        temperature=0.7,
        top_k=5,
        stop_sequences=["END"],
        thinking={"type": "disabled"},
        output_config={"effort": "low", "format": {"type": "json_schema", "schema": {"type": "object"}}},
    )
    assert (mapped.sampling.temperature, mapped.sampling.top_k, mapped.sampling.stop) == (0.7, 5, ("END",))
    assert mapped.sampling.max_tokens == 64
    assert mapped.chat_template_kwargs == {"enable_thinking": False}
    assert mapped.structured_output is not None
    assert mapped.structured_output.json_schema == {"type": "object"}
    assert mapped.structured_output.strict
    # Unset, the sampling defaults are those of Chat Completions (greedy), whatever Anthropic's own are.
    assert params(messages=[{"role": "user", "content": "x"}]).sampling.temperature == 0.0


@pytest.mark.parametrize(
    ("body", "param", "needle"),
    [
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages[0].content[0]",
            "image input",
        ),
        ({"system": [{"type": "document", "source": {}}]}, "system[0]", "document input"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type", "server tool"),
        ({"tools": [{"name": "f"}]}, "tools[0].input_schema", "is required"),
        ({"tools": [WEATHER_TOOL, WEATHER_TOOL]}, "tools[1].name", "duplicate tool name"),
        ({"tool_choice": {"type": "any"}}, "tool_choice", "requires a non-empty tools list"),
        ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice", "not in tools"),
        (
            {"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}},
            "context_management.edits[0]",
            "clear_tool_uses",
        ),
        ({"mcp_servers": [{"type": "url", "url": "http://x"}]}, "mcp_servers", "MCP connector"),
        ({"container": "c1"}, "container", "containers"),
        ({"max_tokens": 0}, "max_tokens", "at least 1"),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x", "content": "r"}]}]},
            "messages[0].content[0].tool_use_id",
            "does not match any earlier tool_use",
        ),
        (
            {"messages": [{"role": "assistant", "content": [{"type": "redacted_thinking", "data": "..."}]}]},
            "messages[0].content[0]",
            "'redacted_thinking' blocks",
        ),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_the_field(body: dict[str, Any], param: str, needle: str) -> None:
    error = refusal(**{"messages": [{"role": "user", "content": "x"}], **body})
    assert error.body.error.param == param
    assert needle in error.body.error.message, error.body.error.message


def test_count_tokens_renders_the_same_prompt_and_generates_nothing() -> None:
    body = {"model": MODEL, "system": "s", "tools": [WEATHER_TOOL], "messages": [{"role": "user", "content": "x"}]}
    counted = messages_request.count_command(CountTokensRequest.model_validate(body), MODEL).params
    generated = params(**{key: value for key, value in body.items() if key != "model"})
    assert counted.count_prompt_only
    assert not generated.count_prompt_only
    assert counted.messages == generated.messages
    assert counted.tool_policy == generated.tool_policy


def test_claude_code_request_is_accepted_as_sent() -> None:
    """The fields Claude Code 2.1 sends on every turn (captured from its requests) all validate and map."""
    body = {
        "model": MODEL,
        "max_tokens": 32000,
        "stream": True,
        "metadata": {"user_id": json.dumps({"device_id": "d", "session_id": "s"})},
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "system": [{"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}}],
        "tools": [WEATHER_TOOL],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}
        ],
    }
    mapped = messages_request.to_command(MessagesRequest.model_validate(body), MODEL).params
    assert mapped.messages == (
        PromptMessage(role="system", content="You are a coding agent."),
        PromptMessage(role="user", content="hi"),
    )
    assert mapped.tool_policy.mode == "auto"


def test_claude_codes_billing_header_block_is_not_part_of_the_prompt() -> None:
    # It changes with every conversation (a hash of the first message): first in the prompt it would defeat the
    # prefix cache for the whole system prompt and every tool definition after it.
    system = [
        {
            "type": "text",
            "text": "x-anthropic-billing-header: cc_version=2.1.197.434; cc_entrypoint=sdk-cli; cch=36ee5;",
        },
        {"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "\nBe brief."},
    ]
    history = params(system=system, messages=[{"role": "user", "content": "x"}]).messages
    assert history[0] == PromptMessage(role="system", content="You are a Claude agent.\nBe brief.")
