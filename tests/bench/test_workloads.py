"""The benchmark's requests are deterministic and shaped like the agent sessions they stand for."""

import json

from bench.parser_cost import hermes_call, segments_of
from bench.workloads import agent_follow_up, agent_tools, system_prompt


def test_system_prompt_has_the_requested_size_and_is_the_same_every_time() -> None:
    assert len(system_prompt(9_500)) == 9_500
    assert system_prompt(9_500) == system_prompt(9_500)


def test_ten_distinct_tool_schemas_each_with_a_required_parameter() -> None:
    tools = agent_tools(10)
    assert len({tool.function.name for tool in tools}) == 10
    for tool in tools:
        properties = tool.function.parameters["properties"]
        assert tool.function.parameters["required"][0] in properties


def test_a_tool_call_reply_is_answered_with_a_tool_result_for_that_call() -> None:
    assistant, result = agent_follow_up(1, "", ("list", '{"path": "src"}'))
    assert assistant.tool_calls is not None
    assert assistant.tool_calls[0].id == result.tool_call_id
    assert result.role == "tool"


def test_a_text_reply_is_followed_by_the_next_user_request() -> None:
    assistant, request = agent_follow_up(1, "It parses arguments.", None)
    assert assistant.content == "It parses arguments."
    assert request.role == "user"


def test_hermes_call_arguments_have_exactly_the_requested_size() -> None:
    for size in (1_000, 10_000, 100_000):
        call = hermes_call(size)
        envelope = json.loads(call.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
        assert len(json.dumps(envelope["arguments"])) == size
        assert "".join(segments_of(call, 4)) == call
