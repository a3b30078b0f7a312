"""Every request the API takes, in each dialect, streamed or not, is handed to the cluster state as one record of how
it ended (production app, scripted runner chunks)."""

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from exo.shared.types.chunks import ErrorChunk, PrefillProgressChunk, TokenChunk
from tests.api.inprocess_app import SCRIPTED_CHUNKS, SCRIPTED_MODEL, SCRIPTED_NODE, ScriptedMaster, scripted_app

PROMPT = "What is the capital of France?"
BODIES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat.completions": (
        "/v1/chat/completions",
        {"model": SCRIPTED_MODEL, "messages": [{"role": "user", "content": PROMPT}]},
    ),
    "messages": (
        "/v1/messages",
        {"model": SCRIPTED_MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": PROMPT}]},
    ),
    "responses": ("/v1/responses", {"model": SCRIPTED_MODEL, "input": PROMPT}),
}


@pytest.fixture
def api() -> Iterator[tuple[TestClient, ScriptedMaster]]:
    application, master = scripted_app()
    with TestClient(application) as client:
        yield client, master


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dialect", list(BODIES))
def test_a_finished_request_is_recorded_once_with_its_dialect_tokens_and_times(
    api: tuple[TestClient, ScriptedMaster], dialect: str, stream: bool
) -> None:
    client, master = api
    master.script = (PrefillProgressChunk(prompt_tokens=3, done_tokens=3, cached_tokens=1), *SCRIPTED_CHUNKS)
    path, body = BODIES[dialect]
    response = client.post(path, json={**body, "stream": stream})
    assert response.status_code == 200, response.text
    (record,) = master.requests
    assert (record.dialect, record.model_id, record.served_by) == (dialect, SCRIPTED_MODEL, SCRIPTED_NODE)
    assert (record.outcome, record.finish_reason, record.error) == ("finished", "stop", None)
    # The finish's usage counts win over what the prefill's progress said (1 cached).
    assert (record.prompt_tokens, record.cached_tokens, record.completion_tokens) == (3, 0, 2)
    assert record.time_to_first_token_seconds is not None
    assert record.time_to_first_token_seconds >= 0
    assert PROMPT not in record.model_dump_json()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dialect", list(BODIES))
def test_a_failed_request_is_recorded_with_its_error(
    api: tuple[TestClient, ScriptedMaster], dialect: str, stream: bool
) -> None:
    client, master = api
    master.script = (TokenChunk(text="Par"), ErrorChunk(error="generation_failed", message="the engine raised"))
    path, body = BODIES[dialect]
    client.post(path, json={**body, "stream": stream})
    (record,) = master.requests
    assert (record.dialect, record.outcome) == (dialect, "failed")
    assert (record.error_kind, record.error) == ("generation_failed", "the engine raised")
    assert record.finish_reason is None
    assert record.decode_tokens_per_second is None
