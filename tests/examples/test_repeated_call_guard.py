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

from examples.tool_calling_example import REPEATED_CALL_NOTE, ToolError, ToolRegistry, run_agent

JsonObject = dict[str, JsonValue]


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


class RepeatingModel:
    """Calls lookup(key="a") twice (the second time with other spacing), then answers when told not to use tools."""

    def __init__(self) -> None:
        self.requests: list[JsonObject] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = cast(JsonObject, json.loads(request.content))
        self.requests.append(body)
        turn = len(self.requests)
        if turn == 1:
            message: JsonObject = {
                "role": "assistant",
                "content": None,
                "tool_calls": [_call("call_1", '{"key": "a"}')],
            }
            return httpx.Response(200, json=_reply(message, "tool_calls"))
        if turn == 2:
            message = {"role": "assistant", "content": None, "tool_calls": [_call("call_2", '{ "key":"a" }')]}
            return httpx.Response(200, json=_reply(message, "tool_calls"))
        answer = "a is 1" if body.get("tool_choice") == "none" else "still calling"
        return httpx.Response(200, json=_reply({"role": "assistant", "content": answer}, "stop"))


def test_a_repeated_call_gets_a_note_instead_of_a_second_run_and_the_next_turn_is_asked_without_tools() -> None:
    runs: list[str] = []

    def lookup(key: str) -> int:
        """Look a key up."""
        runs.append(key)
        return 1

    registry = ToolRegistry()
    registry.register(lookup)
    model = RepeatingModel()
    client = OpenAI(
        base_url="http://scripted/v1",
        api_key="unused",
        http_client=httpx.Client(transport=httpx.MockTransport(model.handle)),
    )

    result = run_agent(client, "scripted", "What is a?", registry, stream=False, output=io.StringIO())

    assert runs == ["a"]  # the repeat (same arguments, other spacing) was not run again
    assert [run.ok for run in result.tool_runs] == [True, False]
    note = ToolError.model_validate_json(result.tool_runs[1].result)
    assert (note.error, note.message) == ("repeated_call", REPEATED_CALL_NOTE.format(name="lookup"))
    assert [request.get("tool_choice") for request in model.requests] == ["auto", "auto", "none"]
    last_messages = cast(list[JsonObject], model.requests[2]["messages"])
    assert last_messages[-1] == {"role": "tool", "tool_call_id": "call_2", "content": result.tool_runs[1].result}
    assert result.answer == "a is 1"


def test_the_same_tool_with_other_arguments_runs_and_leaves_tools_offered() -> None:
    runs: list[str] = []

    def lookup(key: str) -> int:
        """Look a key up."""
        runs.append(key)
        return len(runs)

    registry = ToolRegistry()
    registry.register(lookup)
    requests: list[JsonObject] = []

    def handle(request: httpx.Request) -> httpx.Response:
        body = cast(JsonObject, json.loads(request.content))
        requests.append(body)
        if len(requests) <= 2:
            key = "a" if len(requests) == 1 else "b"
            message: JsonObject = {
                "role": "assistant",
                "content": None,
                "tool_calls": [_call(f"call_{len(requests)}", json.dumps({"key": key}))],
            }
            return httpx.Response(200, json=_reply(message, "tool_calls"))
        return httpx.Response(200, json=_reply({"role": "assistant", "content": "done"}, "stop"))

    client = OpenAI(
        base_url="http://scripted/v1", api_key="unused", http_client=httpx.Client(transport=httpx.MockTransport(handle))
    )
    result = run_agent(client, "scripted", "Look up a and b.", registry, stream=False, output=io.StringIO())

    assert runs == ["a", "b"]
    assert all(run.ok for run in result.tool_runs)
    assert [request.get("tool_choice") for request in requests] == ["auto", "auto", "auto"]
    assert result.answer == "done"
