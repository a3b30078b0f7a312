"""A body that does not parse gets a 4xx in the dialect's own error shape on every generating route, never a 500.

FastAPI refuses such bodies itself (an HTTPException raised before the route runs); the Messages routes wrap their
handler to answer in Anthropic's shape, and once turned FastAPI's 400 into a 500. The cases are the classes of
malformed body: nesting deeper than the JSON parser recurses, truncated JSON, text that is not JSON, an empty body.
"""

import pytest
from fastapi.testclient import TestClient

from tests.api.inprocess_app import SCRIPTED_MODEL, scripted_app

ANTHROPIC_ROUTES = ("/v1/messages", "/v1/messages/count_tokens")
OPENAI_ROUTES = ("/v1/chat/completions", "/v1/responses", "/v1/responses/input_tokens")
OLLAMA_ROUTES = ("/api/chat", "/api/generate", "/api/show")


def nested(depth: int) -> bytes:
    return f'{{"model": "{SCRIPTED_MODEL}", "messages": {"[" * depth}{"]" * depth}}}'.encode()


MALFORMED: dict[str, bytes] = {
    "nested 1,000 deep": nested(1_000),
    "nested 100,000 deep": nested(100_000),
    "truncated": f'{{"model": "{SCRIPTED_MODEL}", "messages": [{{"role": "user", "content": "Hel'.encode(),
    "not JSON": b"model=scripted&messages=hello",
    "empty": b"",
}


@pytest.fixture(scope="module")
def client() -> TestClient:
    app, _ = scripted_app()
    return TestClient(app, raise_server_exceptions=False)


@pytest.mark.parametrize("route", ANTHROPIC_ROUTES + OPENAI_ROUTES + OLLAMA_ROUTES)
@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_body_is_a_4xx_in_the_dialects_shape(client: TestClient, route: str, case: str) -> None:
    response = client.post(route, content=MALFORMED[case], headers={"content-type": "application/json"})

    assert 400 <= response.status_code < 500, (route, case, response.status_code, response.text)
    body = response.json()
    if route in ANTHROPIC_ROUTES:
        assert body["type"] == "error"
        assert body["error"]["type"] == "invalid_request_error"
        message = body["error"]["message"]
    elif route in OLLAMA_ROUTES:
        assert set(body) == {"error"}
        message = body["error"]
    else:
        assert body["error"]["type"] == "invalid_request_error"
        message = body["error"]["message"]
    assert message
    if case.startswith("nested"):
        assert "nests JSON" in message, message


def test_the_app_still_serves_after_malformed_bodies(client: TestClient) -> None:
    for body in MALFORMED.values():
        client.post("/v1/messages", content=body, headers={"content-type": "application/json"})
    request = {"model": SCRIPTED_MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "Hello!"}]}
    response = client.post("/v1/messages", json=request)
    assert response.status_code == 200, response.text
    assert response.json()["type"] == "message"
