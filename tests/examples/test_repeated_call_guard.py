"""The example's loop guard: a repeated call is not run again, and the next turn must answer in text.

The real fixture models never repeat a call, so a scripted OpenAI-compatible endpoint (httpx.MockTransport behind
the real `openai` client) plays a model that does, as the 0.5B default model does; it records what the loop sent.
"""

import io
import json
from typing import cast

import httpx2 as httpx  # the HTTP library openai 3.x is built on
from openai import OpenAI
from pydantic import JsonValue

from examples.agent_tools.registry import ToolError, ToolRegistry
from examples.tool_calling_example import REPEATED_CALL_NOTE, run_agent

JsonObject = dict[str, JsonValue]
ANSWER_WITHOUT_TOOLS = "a is 1 (asked without tools)"
ANSWER_WITH_TOOLS = "done (asked with tools offered)"


def _reply(message: JsonObject, finish_reason: str) -> JsonObject:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 0,
        "model": "scripted",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
    }


def _call(call_id: str, arguments: str) -> JsonObject:
    return {"id": call_id, "type": "function", "function": {"name": "lookup", "arguments": arguments}}


class ScriptedModel:
    """Calls lookup once per turn with the given arguments, then answers, saying whether tools were still offered."""

    def __init__(self, *call_arguments: str) -> None:
        self.call_arguments = call_arguments
        self.requests: list[JsonObject] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = cast(JsonObject, json.loads(request.content))
        self.requests.append(body)
        turn = len(self.requests)
        if turn <= len(self.call_arguments):
            call = _call(f"call_{turn}", self.call_arguments[turn - 1])
            message: JsonObject = {"role": "assistant", "content": None, "tool_calls": [call]}
            return httpx.Response(200, json=_reply(message, "tool_calls"))
        answer = ANSWER_WITHOUT_TOOLS if body.get("tool_choice") == "none" else ANSWER_WITH_TOOLS
        return httpx.Response(200, json=_reply({"role": "assistant", "content": answer}, "stop"))

    def client(self) -> OpenAI:
        transport = httpx.MockTransport(self.handle)
        return OpenAI(base_url="http://scripted/v1", api_key="unused", http_client=httpx.Client(transport=transport))


def lookup_registry(runs: list[str]) -> ToolRegistry:
    """A registry with one tool, lookup(key), that records each key it is run with."""

    def lookup(key: str) -> int:
        """Look a key up."""
        runs.append(key)
        return len(runs)

    registry = ToolRegistry()
    registry.register(lookup)
    return registry


def test_a_repeated_call_gets_a_note_instead_of_a_second_run_and_the_next_turn_is_asked_without_tools() -> None:
    runs: list[str] = []
    model = ScriptedModel('{"key": "a"}', '{ "key":"a" }')  # the same arguments, spaced differently

    result = run_agent(
        model.client(), "scripted", "What is a?", lookup_registry(runs), stream=False, output=io.StringIO()
    )

    assert runs == ["a"]  # the repeat was not run again
    assert [run.ok for run in result.tool_runs] == [True, False]
    note = ToolError.model_validate_json(result.tool_runs[1].result)
    assert (note.error, note.message) == ("repeated_call", REPEATED_CALL_NOTE.format(name="lookup"))
    assert [request.get("tool_choice") for request in model.requests] == ["auto", "auto", "none"]
    last_messages = cast(list[JsonObject], model.requests[2]["messages"])
    assert last_messages[-1] == {"role": "tool", "tool_call_id": "call_2", "content": result.tool_runs[1].result}
    assert result.answer == ANSWER_WITHOUT_TOOLS


def test_the_same_tool_with_other_arguments_runs_and_leaves_tools_offered() -> None:
    runs: list[str] = []
    model = ScriptedModel('{"key": "a"}', '{"key": "b"}')

    result = run_agent(
        model.client(), "scripted", "Look up a and b.", lookup_registry(runs), stream=False, output=io.StringIO()
    )

    assert runs == ["a", "b"]
    assert all(run.ok for run in result.tool_runs)
    assert [request.get("tool_choice") for request in model.requests] == ["auto", "auto", "auto"]
    assert result.answer == ANSWER_WITH_TOOLS
