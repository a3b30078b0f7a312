"""Property: no request body, however hostile, gets a 5xx from a real node or stops it from serving the next one.

Bodies are generated from each endpoint's own request model (hostile_bodies.py): every field, nested, with lone
surrogates, NUL, huge and negative numbers, NaN, wrong types and schemas without end, mixed with bodies that are
sound enough to reach the model. They go to a real node serving tiny-qwen-tools over HTTP; after every batch a
normal request must still get the model's usual answer.
"""

import json
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from exo.api.ollama.wire import OllamaChatRequest, OllamaGenerateRequest
from exo.api.types.anthropic_messages import CountTokensRequest, MessagesRequest
from exo.api.types.openai_responses import InputTokensRequest, ResponsesRequest
from exo.shared.types.api import ChatCompletionRequest
from tests.exo_server import ExoServer, fixture_model, running_exo
from tests.fixtures.fixture_specs import GREETING_REPLY
from tests.master.hostile_bodies import hostile_bodies

MODEL = "tiny-qwen-tools"
EXAMPLES = 40
BATCH = 10
# What a failure on the server's side looks like inside a 200 stream, in each protocol's error shape.
SERVER_FAILURES = ('"server_error"', '"api_error"', '"internal_error"', "internal server error")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExoServer]:
    with running_exo([fixture_model(MODEL)], tmp_path_factory.mktemp("exo-hostile")) as server:
        yield server


def assert_still_serving(client: httpx.Client) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello!"}], "temperature": 0}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == GREETING_REPLY


def send(client: httpx.Client, path: str, body: dict[str, object]) -> httpx.Response:
    # ensure_ascii writes a lone surrogate as the JSON escape "\ud800", as an attacker's client would.
    content = json.dumps(body, ensure_ascii=True, allow_nan=True).encode()
    return client.post(path, content=content, headers={"Content-Type": "application/json"})


@pytest.mark.parametrize(
    ("path", "model"),
    [
        ("/v1/chat/completions", ChatCompletionRequest),
        ("/v1/messages", MessagesRequest),
        ("/v1/responses", ResponsesRequest),
        ("/v1/messages/count_tokens", CountTokensRequest),
        ("/v1/responses/input_tokens", InputTokensRequest),
        ("/api/chat", OllamaChatRequest),
        ("/api/generate", OllamaGenerateRequest),
    ],
)
def test_hostile_bodies_never_get_a_5xx_and_the_node_keeps_serving(
    node: ExoServer, path: str, model: type[BaseModel]
) -> None:
    bodies = st.one_of(
        hostile_bodies(model, MODEL, 0, lean=True),
        hostile_bodies(model, MODEL, 8, lean=True),
        hostile_bodies(model, MODEL, 25),
        hostile_bodies(model, MODEL, 6),
    )
    with httpx.Client(base_url=node.base_url, timeout=120) as client:
        sent: list[int] = []

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
        )
        @given(body=bodies)
        def refused_or_served(body: dict[str, object]) -> None:
            response = send(client, path, body)
            shown = json.dumps(body, ensure_ascii=True, allow_nan=True)[:2000]
            assert response.status_code < 500, f"{path} {shown} -> {response.status_code} {response.text}"
            if response.status_code == 200 and body.get("stream") is True:
                assert not any(failure in response.text for failure in SERVER_FAILURES), (shown, response.text)
            sent.append(response.status_code)
            if len(sent) % BATCH == 0:
                assert_still_serving(client)

        refused_or_served()
        assert_still_serving(client)
    # The mix reached both sides: refusals and bodies the node served.
    assert 200 in sent, sent
    assert any(400 <= status < 500 for status in sent), sent
