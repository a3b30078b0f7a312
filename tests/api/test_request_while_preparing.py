"""A request for a model still being prepared (downloaded, imported, loaded) waits for it, as Ollama's do, instead of
a 503 the client must retry: a newcomer's first request right after `exo` starts is answered once the model is
ready. Past the wait, or for a client that leaves, it ends as before (the 503 now says `model_loading` with a
Retry-After)."""

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from exo.api import completion_flow
from exo.shared.types.state import State
from tests.api.inprocess_app import SCRIPTED_MODEL, SCRIPTED_NODE, SCRIPTED_REPLY, ScriptedMaster, scripted_app

READY_AFTER_SECONDS = 0.6


@pytest.fixture
def app() -> Iterator[tuple[TestClient, ScriptedMaster]]:
    application, master = scripted_app()
    with TestClient(application) as client:
        yield client, master


def preparing(state: State) -> State:
    """`state` with the scripted model being imported on its node and no runner serving it yet."""
    node = state.nodes[SCRIPTED_NODE].model_copy(update={"preparing": (SCRIPTED_MODEL,)})
    return state.model_copy(update={"nodes": {SCRIPTED_NODE: node}, "runners": {}})


def ready_later(master: ScriptedMaster, seconds: float) -> threading.Timer:
    """Puts the model in preparation now and serves it after `seconds`, as a node finishing an import does."""
    ready = master.state
    master.state = preparing(ready)

    def serve() -> None:
        master.state = ready

    timer = threading.Timer(seconds, serve)
    timer.start()
    return timer


CHAT: dict[str, Any] = {"model": SCRIPTED_MODEL, "messages": [{"role": "user", "content": "hi"}]}
MESSAGES: dict[str, Any] = {**CHAT, "max_tokens": 16}
RESPONSES: dict[str, Any] = {"model": SCRIPTED_MODEL, "input": "hi"}


@pytest.mark.parametrize(
    ("path", "body", "reply_of"),
    [
        ("/v1/chat/completions", CHAT, lambda body: body["choices"][0]["message"]["content"]),
        ("/v1/messages", MESSAGES, lambda body: body["content"][0]["text"]),
        ("/v1/responses", RESPONSES, lambda body: body["output"][0]["content"][0]["text"]),
        ("/api/chat", {**CHAT, "stream": False}, lambda body: body["message"]["content"]),
    ],
)
def test_a_request_sent_while_the_model_is_prepared_is_answered_once_it_is_ready(
    app: tuple[TestClient, ScriptedMaster], path: str, body: dict[str, Any], reply_of: Any
) -> None:
    client, master = app
    timer = ready_later(master, READY_AFTER_SECONDS)
    sent = time.monotonic()
    answer = client.post(path, json=body)
    timer.join()
    assert answer.status_code == 200, answer.text
    assert reply_of(answer.json()) == SCRIPTED_REPLY
    assert time.monotonic() - sent >= READY_AFTER_SECONDS
    assert len(master.tasks) == 1


def test_an_unnamed_model_and_an_ollama_load_wait_too(app: tuple[TestClient, ScriptedMaster]) -> None:
    client, master = app
    timer = ready_later(master, READY_AFTER_SECONDS)
    answer = client.post("/v1/chat/completions", json={"messages": CHAT["messages"], "stream": True})
    timer.join()
    assert answer.status_code == 200
    assert SCRIPTED_REPLY in answer.text
    timer = ready_later(master, READY_AFTER_SECONDS)
    loaded = client.post("/api/generate", json={"model": SCRIPTED_MODEL})  # Ollama's "load the model"
    timer.join()
    assert loaded.status_code == 200
    assert loaded.json()["model"] == SCRIPTED_MODEL
    assert loaded.json()["done_reason"] == "load"


def test_past_the_wait_the_request_gets_a_503_model_loading_with_retry_after(
    app: tuple[TestClient, ScriptedMaster], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, master = app
    monkeypatch.setattr(completion_flow, "PREPARING_WAIT_SECONDS", 0.3)
    master.state = preparing(master.state)
    sent = time.monotonic()
    answer = client.post("/v1/chat/completions", json=CHAT)
    assert time.monotonic() - sent >= 0.3
    assert answer.status_code == 503
    assert answer.headers["retry-after"] == str(completion_flow.UNAVAILABLE_RETRY_AFTER_SECONDS)
    error = answer.json()["error"]
    assert (error["code"], error["type"]) == ("model_loading", "server_error")
    assert f"model '{SCRIPTED_MODEL}' is still being prepared" in error["message"]
    messages = client.post("/v1/messages", json=MESSAGES)
    assert messages.status_code == 503
    assert messages.json()["type"] == "error"
    assert not master.tasks


def test_a_model_nobody_prepares_is_refused_at_once(app: tuple[TestClient, ScriptedMaster]) -> None:
    client, master = app
    master.state = preparing(master.state)
    sent = time.monotonic()
    answer = client.post("/v1/chat/completions", json={**CHAT, "model": "no-such-model"})
    assert time.monotonic() - sent < 5
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "model_not_found"
