"""The requests Claude Code and Codex CLI really send, replayed against a real node: the wire is proven without
the CLIs installed.

tests/fixtures/clients holds both clients' captured requests for one tool round trip (see client_requests), sent
here as captured (streaming, every field the client sets) to exo serving tiny-qwen-claude-code. Claude Code's
first turn must stream the Write call it runs, its second the final answer, and the second must reuse the first
one's prompt from the prefix cache. The model was not trained on Codex's requests, so for those the wire alone is
checked: both turns (history with the function call and its output included) are accepted, rendered, generated
and streamed in events that pass the Responses checker and the SDK's accumulator.
"""

import json
from collections.abc import Iterator

import httpx
import pytest

from exo.conformance.messages_contract import check_messages_stream
from exo.conformance.protocol_check import ProtocolCheck
from exo.conformance.responses_contract import check_responses_stream
from tests.exo_server import ExoServer, fixture_model, running_exo
from tests.fixtures.client_requests import CLAUDE_CODE_MODEL, ClientCapture, client_request
from tests.fixtures.fixture_specs import AGENT_DONE_REPLY, JsonObject

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    with running_exo([fixture_model(CLAUDE_CODE_MODEL)], tmp_path_factory.mktemp("exo-captured")) as running:
        yield running


def replay(server: ExoServer, path: str, body: JsonObject) -> tuple[str, ProtocolCheck]:
    response = httpx.post(f"{server.base_url}{path}", json={**body, "model": CLAUDE_CODE_MODEL}, timeout=300)
    assert response.status_code == 200, response.text
    checked = check_messages_stream(response.text) if path == "/v1/messages" else check_responses_stream(response.text)
    assert checked.violations == (), checked.violations
    return response.text, checked


def last_data(stream: str, from_end: int) -> dict[str, object]:
    payload: dict[str, object] = json.loads(
        [line for line in stream.splitlines() if line.startswith("data: ")][-from_end].removeprefix("data: ")
    )
    return payload


def test_claude_codes_requests_get_the_write_call_then_the_answer_from_the_cache(server: ExoServer) -> None:
    _, first = replay(server, "/v1/messages", client_request("claude_code_first_turn"))
    assert [(call.name, json.loads(call.arguments)) for call in first.summary.calls] == [
        ("Write", {"file_path": "hello.txt", "content": "hello"})
    ]
    assert first.summary.stop == "tool_use"
    stream, second = replay(server, "/v1/messages", client_request("claude_code_after_write"))
    assert (second.summary.content, second.summary.calls, second.summary.stop) == (AGENT_DONE_REPLY, (), "end_turn")
    usage = last_data(stream, 2)["usage"]  # message_delta, before message_stop
    assert isinstance(usage, dict)
    cached = usage["cache_read_input_tokens"]  # pyright: ignore[reportUnknownVariableType]
    assert isinstance(cached, int)
    assert cached > 0, usage


@pytest.mark.parametrize("capture", ["codex_first_turn", "codex_after_exec"])
def test_codex_cli_requests_are_served_and_streamed_in_the_responses_grammar(
    server: ExoServer, capture: ClientCapture
) -> None:
    # Codex sets no output limit; an untrained model would write until the context is full.
    body = {**client_request(capture), "max_output_tokens": 32}
    stream, checked = replay(server, "/v1/responses", body)
    assert checked.summary.stop in ("response.completed", "response.incomplete")
    final = last_data(stream, 1)["response"]
    assert isinstance(final, dict)
    usage = final["usage"]  # pyright: ignore[reportUnknownVariableType]
    assert isinstance(usage, dict)
    counted = httpx.post(
        f"{server.base_url}/v1/responses/input_tokens",
        json={key: body[key] for key in ("input", "tools", "tool_choice", "parallel_tool_calls")}
        | {"model": CLAUDE_CODE_MODEL},
        timeout=120,
    )
    assert counted.status_code == 200, counted.text
    # The whole captured prompt was rendered: the count endpoint renders it the same way.
    assert counted.json()["input_tokens"] == usage["input_tokens"] > 1000
