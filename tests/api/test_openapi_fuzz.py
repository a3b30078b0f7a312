"""Schemathesis fuzzes the app's own OpenAPI schema: no input may cause a 5xx, and every error has its protocol's
shape (OpenAI's, Anthropic's on the Messages API).

It runs against the production app in process (scripted master, see inprocess_app) with a fixed number of
examples and a derandomized seed, so it is fast and a failure reproduces exactly.
"""

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import APIOperation, Case, GenerationMode

from tests.api.inprocess_app import scripted_app

APP, MASTER = scripted_app()
FuzzCase = Case[APIOperation[Any, Any, Any, Any]]
SCHEMA = schemathesis.openapi.from_asgi("/openapi.json", APP)
EXAMPLES = 50


def assert_well_behaved(case: FuzzCase) -> None:
    response = case.call()
    assert response.status_code < 500, f"{case.method} {case.path} {case.body!r} -> {response.text}"
    if response.status_code >= 400 and case.path.startswith("/v1/messages"):
        payload: Any = response.json()
        assert set(payload) == {"type", "error"}, response.text
        assert payload["type"] == "error"
        assert set(payload["error"]) == {"type", "message"}, response.text
        assert payload["error"]["message"]
    elif response.status_code >= 400:
        payload = response.json()
        assert set(payload) == {"error"}, response.text
        assert set(payload["error"]) == {"message", "type", "param", "code"}, response.text
        assert isinstance(payload["error"]["message"], str)
        assert payload["error"]["message"]


@pytest.mark.parametrize(
    ("method", "path", "mode"),
    [
        ("POST", "/v1/chat/completions", GenerationMode.POSITIVE),
        ("POST", "/v1/chat/completions", GenerationMode.NEGATIVE),
        ("POST", "/v1/messages", GenerationMode.POSITIVE),
        ("POST", "/v1/messages", GenerationMode.NEGATIVE),
        ("POST", "/v1/messages/count_tokens", GenerationMode.POSITIVE),
        ("POST", "/v1/responses", GenerationMode.POSITIVE),
        ("POST", "/v1/responses", GenerationMode.NEGATIVE),
        ("POST", "/v1/responses/input_tokens", GenerationMode.POSITIVE),
        ("GET", "/v1/models", GenerationMode.POSITIVE),
        ("GET", "/state", GenerationMode.POSITIVE),
        ("GET", "/health", GenerationMode.POSITIVE),
    ],
)
def test_fuzzed_requests_never_get_a_5xx_and_errors_have_their_protocols_shape(
    method: str, path: str, mode: GenerationMode
) -> None:
    operation = SCHEMA[path][method]

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case: FuzzCase) -> None:
        assert_well_behaved(case)

    check()


def test_positive_fuzzing_reaches_the_master() -> None:
    """The positive run above is not vacuous: schema-valid requests get through validation to generation."""
    operation = SCHEMA["/v1/chat/completions"]["POST"]
    before = len(MASTER.tasks)

    @settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None)
    @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE))
    def send(case: FuzzCase) -> None:
        case.call()

    send()
    assert len(MASTER.tasks) > before
