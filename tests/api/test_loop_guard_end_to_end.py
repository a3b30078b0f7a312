"""The agent-loop guard over HTTP, in every dialect, on a real node (exo subprocess, runner, MLX forward passes of
the tiny-qwen-tools fixture): replayed conversations whose history makes the model write `get_weather` for Paris
once more, answered by the node's default policy (`answer`).

A real loop (the third identical call in a row, after the same result twice; from the fifth, after the same error
result four times) is withdrawn and the client is told in its dialect's extension field and usage; a second
identical call, poll / other call / poll, a result that changed, up to three retries after the same error and the
user asking again all go through; the `X-Exo-Loop-Guard` header overrides the node (a bad value is a 400 in the
dialect's error shape naming the header), and the body field wins over it where the dialect has one.

The conversations are the ones on which the fixture's greedy decoding writes the call (with the guard off): the
fixture was trained on a few fixed prompts, and these histories lead it to `get_weather({"city": "Paris"})`.
"""

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import httpx
import pytest

from exo.shared.types.tasks import LOOP_GUARD_HEADER
from tests.exo_server import ExoServer, fixture_model, running_exo
from tests.fixtures.fixture_specs import GET_TIME_TOOL, GET_WEATHER_TOOL

QWEN = "tiny-qwen-tools"
QUESTION = "What is the weather in Paris?"
# A tool result that leads the fixture to call get_weather for Paris again.
AGAIN = "What is the weather in Paris and Tokyo?"
PARIS: dict[str, Any] = {"city": "Paris"}
TOKYO_TIME: dict[str, Any] = {"timezone": "Asia/Tokyo"}


@dataclass(frozen=True)
class Call:
    """One assistant call of the replayed history, with its result."""

    name: str
    arguments: dict[str, Any]
    result: str
    error: bool = False
    """Sent as an error: Messages' `is_error: true` (exo writes it into the result as "Error: …"), else the text."""

    def result_text(self) -> str:
        return f"Error: {self.result}" if self.error else self.result


@dataclass(frozen=True)
class Conversation:
    calls: tuple[Call, ...]
    tools: tuple[dict[str, Any], ...] = (GET_WEATHER_TOOL,)
    user_after: str | None = None
    """A user message after the last result."""


def _paris(result: str, *, error: bool = False) -> Call:
    return Call("get_weather", PARIS, result, error)


LOOP = Conversation((_paris(AGAIN), _paris(AGAIN)))
PROGRESSING = Conversation((_paris(f"{AGAIN} (1)"), _paris(AGAIN)))
AFTER_ERRORS = Conversation((_paris("Paris and Tokyo?", error=True), _paris("Paris and Tokyo?", error=True)))
# Three identical errors (a result the fixture writes the call again after).
AFTER_THREE_ERRORS = Conversation(tuple(_paris("Paris", error=True) for _ in range(3)))
# The call failed the same way five times: the sixth identical call is a real loop (it is one from the fifth, after
# four identical errors; five are the history on which the fixture writes the call again). An agent's model given the
# same error again writes the same call again, as opencode's read of a 2-line file at offset 2000 did until its
# timeout.
ERROR_LOOP = Conversation(
    tuple(_paris("city not found: Paris", error=True) for _ in range(5)), tools=(GET_WEATHER_TOOL, GET_TIME_TOOL)
)
SECOND = Conversation((_paris(AGAIN),), tools=(GET_WEATHER_TOOL, GET_TIME_TOOL))
POLL_OTHER_POLL = Conversation(
    (_paris(AGAIN), Call("get_time", TOKYO_TIME, "12:00"), _paris(AGAIN)), tools=(GET_WEATHER_TOOL, GET_TIME_TOOL)
)
# The user asks again right after the results (in Messages, beside them in the same user turn, as Claude Code does).
ASKED_AGAIN = Conversation(
    (_paris("Paris and Tokyo?"), _paris("Paris and Tokyo?")), user_after="Check the weather in Paris again."
)


@dataclass
class Answer:
    """What a client reads from one answer, whatever the dialect."""

    calls: list[tuple[str, dict[str, Any]]]
    warnings: list[str]
    withdrawn: int | None
    """usage.withdrawn_tool_calls (0 when absent); None in a dialect without usage."""
    finish: str


# ---- the four dialects ---------------------------------------------------------------------------------------------


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    return cast(dict[str, Any], tool["function"])


def _chat_body(conversation: Conversation, stream: bool) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    for position, call in enumerate(conversation.calls):
        call_id = f"call_{position}"
        function = {"name": call.name, "arguments": json.dumps(call.arguments)}
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": call_id, "type": "function", "function": function}],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": call.result_text()})
    if conversation.user_after:
        messages.append({"role": "user", "content": conversation.user_after})
    body: dict[str, Any] = {"model": QWEN, "messages": messages, "tools": list(conversation.tools), "max_tokens": 40}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    return {**body, "temperature": 0.0}


def _chat_answer(body: dict[str, Any]) -> Answer:
    choice = body["choices"][0]
    calls = [
        (call["function"]["name"], json.loads(call["function"]["arguments"]))
        for call in choice["message"].get("tool_calls") or []
    ]
    usage = body["usage"]
    return Answer(
        calls, body.get("exo_loop_warnings") or [], usage.get("withdrawn_tool_calls", 0), choice["finish_reason"]
    )


def _chat_stream(text: str) -> Answer:
    calls: dict[int, list[str]] = {}
    warnings: list[str] = []
    withdrawn = 0
    finish = ""
    for payload in _sse_data(text):
        if payload == "[DONE]":
            continue
        event = json.loads(payload)
        if event.get("usage"):
            withdrawn = event["usage"].get("withdrawn_tool_calls", 0)
        for choice in event["choices"]:
            for delta in choice["delta"].get("tool_calls") or []:
                entry = calls.setdefault(delta["index"], ["", ""])
                entry[0] += delta["function"].get("name") or ""
                entry[1] += delta["function"].get("arguments") or ""
            if choice["finish_reason"]:
                finish = choice["finish_reason"]
                warnings = event.get("exo_loop_warnings") or []
    return Answer([(name, json.loads(arguments)) for name, arguments in calls.values()], warnings, withdrawn, finish)


def _messages_body(conversation: Conversation, stream: bool) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    for position, call in enumerate(conversation.calls):
        call_id = f"toolu_{position}"
        messages.append(
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": call_id, "name": call.name, "input": call.arguments}],
            }
        )
        result = {"type": "tool_result", "tool_use_id": call_id, "content": call.result, "is_error": call.error}
        messages.append({"role": "user", "content": [result]})
    if conversation.user_after:
        messages[-1]["content"].append({"type": "text", "text": conversation.user_after})
    tools = [
        {
            "name": _function(tool)["name"],
            "description": _function(tool)["description"],
            "input_schema": _function(tool)["parameters"],
        }
        for tool in conversation.tools
    ]
    return {"model": QWEN, "messages": messages, "tools": tools, "max_tokens": 40, "stream": stream, "temperature": 0.0}


def _messages_answer(body: dict[str, Any]) -> Answer:
    calls = [(block["name"], block["input"]) for block in body["content"] if block["type"] == "tool_use"]
    warnings = body.get("exo_loop_warnings") or []
    return Answer(calls, warnings, body["usage"].get("withdrawn_tool_calls", 0), body["stop_reason"])


def _messages_stream(text: str) -> Answer:
    calls: dict[int, list[Any]] = {}
    warnings: list[str] = []
    withdrawn = 0
    finish = ""
    for payload in _sse_data(text):
        event = json.loads(payload)
        match event["type"]:
            case "content_block_start" if event["content_block"]["type"] == "tool_use":
                calls[event["index"]] = [event["content_block"]["name"], ""]
            case "content_block_delta" if event["delta"]["type"] == "input_json_delta":
                calls[event["index"]][1] += event["delta"]["partial_json"]
            case "message_delta":
                warnings = event.get("exo_loop_warnings") or []
                withdrawn = event["usage"].get("withdrawn_tool_calls", 0)
                finish = event["delta"]["stop_reason"]
            case _:
                pass
    return Answer([(name, json.loads(arguments)) for name, arguments in calls.values()], warnings, withdrawn, finish)


def _responses_body(conversation: Conversation, stream: bool) -> dict[str, Any]:
    items: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    for position, call in enumerate(conversation.calls):
        call_id = f"call_{position}"
        items.append(
            {"type": "function_call", "call_id": call_id, "name": call.name, "arguments": json.dumps(call.arguments)}
        )
        items.append({"type": "function_call_output", "call_id": call_id, "output": call.result_text()})
    if conversation.user_after:
        items.append({"role": "user", "content": conversation.user_after})
    tools = [{"type": "function", **_function(tool)} for tool in conversation.tools]
    return {
        "model": QWEN,
        "input": items,
        "tools": tools,
        "max_output_tokens": 40,
        "stream": stream,
        "temperature": 0.0,
    }


def _responses_answer(body: dict[str, Any]) -> Answer:
    calls = [
        (item["name"], json.loads(item["arguments"])) for item in body["output"] if item["type"] == "function_call"
    ]
    finish = "tool_calls" if calls else body["status"]
    return Answer(calls, body.get("exo_loop_warnings") or [], body["usage"].get("withdrawn_tool_calls", 0), finish)


def _responses_stream(text: str) -> Answer:
    completed = [json.loads(payload) for payload in _sse_data(text) if '"response.completed"' in payload]
    assert len(completed) == 1, text
    return _responses_answer(completed[0]["response"])


def _ollama_body(conversation: Conversation, stream: bool) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    for call in conversation.calls:
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": call.name, "arguments": call.arguments}}],
            }
        )
        messages.append({"role": "tool", "tool_name": call.name, "content": call.result_text()})
    if conversation.user_after:
        messages.append({"role": "user", "content": conversation.user_after})
    options = {"num_predict": 40, "temperature": 0.0}
    return {
        "model": QWEN,
        "messages": messages,
        "tools": list(conversation.tools),
        "stream": stream,
        "options": options,
    }


def _ollama_answer(body: dict[str, Any]) -> Answer:
    calls = [
        (call["function"]["name"], call["function"]["arguments"]) for call in body["message"].get("tool_calls") or []
    ]
    return Answer(calls, body.get("exo_loop_warnings") or [], None, body["done_reason"])


def _ollama_stream(text: str) -> Answer:
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    calls = [
        (call["function"]["name"], call["function"]["arguments"])
        for line in lines
        for call in line.get("message", {}).get("tool_calls") or []
    ]
    final = lines[-1]
    assert final["done"], final
    return Answer(calls, final.get("exo_loop_warnings") or [], None, final["done_reason"])


def _sse_data(text: str) -> list[str]:
    return [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]


@dataclass(frozen=True)
class Dialect:
    name: str
    path: str
    body: Callable[[Conversation, bool], dict[str, Any]]
    whole: Callable[[dict[str, Any]], Answer]
    streamed: Callable[[str], Answer]
    body_field: bool
    """Whether the request body takes `loop_guard`."""
    error_message: Callable[[dict[str, Any]], str]


DIALECTS = [
    Dialect(
        "chat",
        "/v1/chat/completions",
        _chat_body,
        _chat_answer,
        _chat_stream,
        body_field=True,
        error_message=lambda error: error["error"]["message"],
    ),
    Dialect(
        "messages",
        "/v1/messages",
        _messages_body,
        _messages_answer,
        _messages_stream,
        body_field=False,
        error_message=lambda error: error["error"]["message"] if error["type"] == "error" else "",
    ),
    Dialect(
        "responses",
        "/v1/responses",
        _responses_body,
        _responses_answer,
        _responses_stream,
        body_field=False,
        error_message=lambda error: error["error"]["message"],
    ),
    Dialect(
        "ollama",
        "/api/chat",
        _ollama_body,
        _ollama_answer,
        _ollama_stream,
        body_field=True,
        error_message=lambda error: error["error"],
    ),
]

# Messages and Responses bodies take no exo fields (an undeclared field is a 400): the header is their override.
WITH_BODY_FIELD = [dialect for dialect in DIALECTS if dialect.body_field]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    with running_exo([fixture_model(QWEN)], tmp_path_factory.mktemp("exo-loop-guard")) as running:
        yield running


def _ask(
    server: ExoServer,
    dialect: Dialect,
    conversation: Conversation,
    *,
    stream: bool = False,
    header: str | None = None,
    body_policy: str | None = None,
) -> Answer:
    body = dialect.body(conversation, stream)
    if body_policy is not None:
        body["loop_guard"] = body_policy
    headers = {LOOP_GUARD_HEADER: header} if header is not None else {}
    response = httpx.post(f"{server.base_url}{dialect.path}", json=body, headers=headers, timeout=180)
    assert response.status_code == 200, response.text
    return dialect.streamed(response.text) if stream else dialect.whole(response.json())


def _paris_call(answer: Answer) -> bool:
    return answer.calls == [("get_weather", PARIS)]


@pytest.fixture(params=DIALECTS, ids=[dialect.name for dialect in DIALECTS])
def dialect(request: pytest.FixtureRequest) -> Dialect:
    return cast(Dialect, request.param)


# ---- a real loop is withdrawn, and the client is told --------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_real_loop_is_withdrawn_and_the_client_sees_the_notice(
    server: ExoServer, dialect: Dialect, stream: bool
) -> None:
    # The model does write the loop: with the guard off it comes through.
    assert _paris_call(_ask(server, dialect, LOOP, stream=stream, header="off"))
    answer = _ask(server, dialect, LOOP, stream=stream)
    assert answer.calls == []
    assert any("withdrawn" in warning and "get_weather" in warning for warning in answer.warnings), answer.warnings
    if answer.withdrawn is not None:
        assert answer.withdrawn == 1
    assert answer.finish in ("stop", "end_turn", "completed")


@pytest.mark.parametrize("header", [None, "block"], ids=["answer", "block"])
def test_a_call_that_keeps_failing_the_same_way_is_a_real_loop_and_the_client_sees_the_notice(
    server: ExoServer, dialect: Dialect, header: str | None
) -> None:
    assert _paris_call(_ask(server, dialect, ERROR_LOOP, header="off"))
    answer = _ask(server, dialect, ERROR_LOOP, header=header)
    assert ("get_weather", PARIS) not in answer.calls, answer
    if header is None:  # answer: the reply goes on without calls
        assert answer.calls == []
        assert answer.finish in ("stop", "end_turn", "completed")
    notice = "withdrawn: identical call 6 in a row after the same error result 5 times"
    assert any(notice in warning for warning in answer.warnings), answer.warnings
    if answer.withdrawn is not None:
        assert answer.withdrawn == 1


# ---- what is no loop goes through ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "conversation",
    [SECOND, POLL_OTHER_POLL, PROGRESSING, AFTER_ERRORS, AFTER_THREE_ERRORS],
    ids=[
        "second identical call",
        "poll, other call, poll",
        "a result that changed",
        "a retry after errors",
        "a third retry after the same error",
    ],
)
def test_a_legitimate_repeat_goes_through(server: ExoServer, dialect: Dialect, conversation: Conversation) -> None:
    answer = _ask(server, dialect, conversation)
    assert _paris_call(answer), answer
    assert not any("withdrawn" in warning for warning in answer.warnings)
    assert answer.withdrawn in (0, None)
    assert answer.finish in ("tool_calls", "tool_use", "stop")  # Ollama's done_reason is "stop" after calls


@dataclass(frozen=True)
class Verdict:
    """One request under a policy, and what the guard must do with the model's call to get_weather for Paris."""

    conversation: Conversation
    header: str | None
    """The X-Exo-Loop-Guard header (None: the node's own policy, `answer`)."""
    goes_through: bool
    warned: str | None = None
    """Text that one of the answer's notices must contain."""
    not_warned: str | None = None
    """Text that none of them may contain ("": no notice at all)."""
    stream: bool = False


VERDICTS = {
    # The third identical call in a row, after two identical results: only their being errors lets it through (the
    # fifth, after the same error four times, is a real loop: below).
    "a retry after errors is reported under warn": Verdict(
        AFTER_ERRORS,
        "warn",
        goes_through=True,
        warned="identical call 3 in a row",
        not_warned="after identical results",
    ),
    "a retry after errors is not withdrawn": Verdict(AFTER_ERRORS, "block", goes_through=True),
    "three retries after the same error are not withdrawn": Verdict(
        AFTER_THREE_ERRORS, "block", goes_through=True, not_warned="withdrawn"
    ),
    "the same error five times is reported under warn": Verdict(
        ERROR_LOOP,
        "warn",
        goes_through=True,
        warned="identical call 6 in a row since the user last spoke, after the same error result 5 times",
    ),
    "the user asking again, guard off": Verdict(ASKED_AGAIN, "off", goes_through=True),
    "the user asking again goes through unremarked": Verdict(ASKED_AGAIN, None, goes_through=True, not_warned=""),
    # ---- the per-request override ----
    "the header's warn overrides the node": Verdict(
        LOOP, "WARN", goes_through=True, warned="identical call 3 in a row"
    ),
    "the header's block overrides the node": Verdict(
        LOOP, "block", goes_through=False, warned="withdrawn", stream=True
    ),
}


@pytest.mark.parametrize("verdict", VERDICTS.values(), ids=VERDICTS.keys())
def test_the_guard_s_verdict_under_a_policy(server: ExoServer, dialect: Dialect, verdict: Verdict) -> None:
    answer = _ask(server, dialect, verdict.conversation, stream=verdict.stream, header=verdict.header)
    assert answer.calls == ([("get_weather", PARIS)] if verdict.goes_through else []), answer
    if verdict.goes_through:
        assert answer.withdrawn in (0, None)
    if verdict.warned is not None:
        assert any(verdict.warned in warning for warning in answer.warnings), answer.warnings
    if verdict.not_warned is not None:
        assert not any(verdict.not_warned in warning for warning in answer.warnings), answer.warnings


@pytest.mark.parametrize("dialect", WITH_BODY_FIELD, ids=[dialect.name for dialect in WITH_BODY_FIELD])
def test_the_body_field_wins_over_the_header(server: ExoServer, dialect: Dialect) -> None:
    assert _paris_call(_ask(server, dialect, LOOP, header="answer", body_policy="off"))
    assert _ask(server, dialect, LOOP, header="off", body_policy="answer").calls == []


@pytest.mark.parametrize("value", ["sometimes", ""])
def test_a_bad_header_is_a_400_naming_it(server: ExoServer, dialect: Dialect, value: str) -> None:
    body = dialect.body(LOOP, False)
    response = httpx.post(f"{server.base_url}{dialect.path}", json=body, headers={LOOP_GUARD_HEADER: value}, timeout=60)
    assert response.status_code == 400, response.text
    assert LOOP_GUARD_HEADER in dialect.error_message(response.json())
    # The node keeps serving.
    assert _ask(server, dialect, SECOND).calls


# ---- issue 37: the guard never sends a call the model did not write ---------------------------------------------


@pytest.mark.parametrize("policy", ["block", "answer"])
@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}], ids=["required", "named"]
)
@pytest.mark.parametrize("conversation", [SECOND, LOOP], ids=["a second call", "a real loop"])
def test_a_forced_call_is_the_model_s_own_and_finishes_with_tool_calls(
    server: ExoServer, policy: str, tool_choice: object, conversation: Conversation
) -> None:
    """A forced tool_choice with a repeat used to get a call the grammar bent away from the model's own (an argument
    like "42ctest" with tool-response text inside), no notice, and finish_reason "stop" beside the call."""

    def forced(loop_guard: str) -> dict[str, Any]:
        body = {**_chat_body(conversation, False), "tool_choice": tool_choice, "loop_guard": loop_guard}
        response = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=180)
        assert response.status_code == 200, response.text
        return response.json()

    unguarded, guarded = forced("off"), forced(policy)
    assert guarded["choices"][0]["message"]["tool_calls"] is not None
    calls = [call["function"] for call in guarded["choices"][0]["message"]["tool_calls"]]
    assert calls == [call["function"] for call in unguarded["choices"][0]["message"]["tool_calls"]]
    assert [(call["name"], json.loads(call["arguments"])) for call in calls] == [("get_weather", PARIS)]
    assert guarded["choices"][0]["finish_reason"] == "tool_calls"
    warnings = guarded["exo_loop_warnings"] or []
    if conversation is LOOP:
        assert any("not withdrawn" in warning for warning in warnings), warnings
    else:
        assert not any("withdrawn" in warning for warning in warnings), warnings
