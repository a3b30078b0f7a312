"""A body holding more `messages` / `input` items than --max-request-messages is refused by the request guard with a
400 in the dialect's shape, within a second, before any request model is built; at the limit it is served.

On main 0b66627 a 100,000-message body (4 MB, inside the size limit) was validated, adapted and sent to the master:
seconds of work that ended in `503 no_master` under load, or a 400 from the runner after 12-21 s.
"""

import gc
import json
import time
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from exo.api.message_count import DEFAULT_MAX_MESSAGES
from exo.node import NodeConfig
from tests.api.inprocess_app import SCRIPTED_MODEL, scripted_app
from tests.exo_server import ExoServer, fixture_model, running_exo

HUGE = 100_000
SMALL_LIMIT = 40


def _messages(count: int) -> list[dict[str, str]]:
    return [{"role": "user" if index % 2 == 0 else "assistant", "content": "hi"} for index in range(count)]


def _body(path: str, count: int, model: str = SCRIPTED_MODEL) -> dict[str, Any]:
    """A body of `count` short messages (or input items) for `path`."""
    if path.startswith("/v1/responses"):
        return {"model": model, "input": _messages(count)}
    limit = {} if path.endswith(("count_tokens", "/api/chat")) else {"max_tokens": 4}
    return {"model": model, "messages": _messages(count), **limit, **({"stream": False} if path == "/api/chat" else {})}


ROUTES = (
    "/v1/chat/completions",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
    "/v1/responses/input_tokens",
    "/api/chat",
)


def _error_message(path: str, body: dict[str, Any]) -> str:
    if path.startswith("/v1/messages"):
        assert body["error"]["type"] == "invalid_request_error"
        return str(body["error"]["message"])
    if path.startswith("/api/"):
        return str(body["error"])
    assert body["error"]["code"] == "too_many_messages"
    return str(body["error"]["message"])


@pytest.mark.parametrize("path", ROUTES)
def test_a_100k_message_body_is_refused_within_a_second_in_the_dialects_shape(path: str) -> None:
    application, _ = scripted_app()
    content = json.dumps(_body(path, HUGE)).encode()
    with TestClient(application, raise_server_exceptions=False) as client:
        # The app runs inside pytest's process, whose heap holds everything the suite made before this test: frozen,
        # so a collection the request triggers scans what a node's own process would hold, not the whole suite's
        # objects (in a full CI run these six took over a second where the real node's refusal below did not).
        gc.collect()
        gc.freeze()
        try:
            started = time.monotonic()
            response = client.post(path, content=content, headers={"content-type": "application/json"})
            elapsed = time.monotonic() - started
        finally:
            gc.unfreeze()

    assert response.status_code == 400, response.text
    message = _error_message(path, response.json())
    assert f"holds {HUGE} items" in message
    assert f"at most {DEFAULT_MAX_MESSAGES}" in message
    assert elapsed < 1.0, f"refused after {elapsed:.2f} s"


@pytest.mark.parametrize("path", ROUTES)
def test_the_limit_is_configurable_and_a_body_at_it_is_served(path: str) -> None:
    application, _ = scripted_app(NodeConfig(max_request_messages=SMALL_LIMIT))
    with TestClient(application, raise_server_exceptions=False) as client:
        at_limit = client.post(path, json=_body(path, SMALL_LIMIT))
        over = client.post(path, json=_body(path, SMALL_LIMIT + 1))

    assert at_limit.status_code == 200, at_limit.text
    assert over.status_code == 400, over.text
    assert f"at most {SMALL_LIMIT}" in _error_message(path, over.json())


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with running_exo([fixture_model("tiny-qwen-tools")], tmp_path_factory.mktemp("exo-huge")) as server:
        yield server


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/chat"])
def test_a_real_node_refuses_a_100k_message_body_within_a_second_and_keeps_serving(node: ExoServer, path: str) -> None:
    content = json.dumps(_body(path, HUGE, "tiny-qwen-tools")).encode()
    with httpx.Client(base_url=node.base_url, timeout=60) as client:
        started = time.monotonic()
        response = client.post(path, content=content, headers={"content-type": "application/json"})
        elapsed = time.monotonic() - started
        assert response.status_code == 400, response.text
        assert elapsed < 1.0, f"refused after {elapsed:.2f} s"
        hello = {"model": "tiny-qwen-tools", "messages": _messages(1), "max_tokens": 4}
        assert client.post("/v1/chat/completions", json=hello).status_code == 200
    assert "second assignment" not in node.log()
