"""The body-text check on its own: what it finds, where it says it is, and what it leaves alone."""

import json

import pytest

from exo.api.body_text import find_body_problem


def body(document: object) -> bytes:
    return json.dumps(document).encode()  # ensure_ascii: surrogates and NUL travel as \\u escapes, as clients send


@pytest.mark.parametrize(
    ("document", "param", "needle"),
    [
        ({"messages": [{"role": "user", "content": "\ud800"}]}, "messages[0].content", "surrogate (\\ud800)"),
        ({"model": "x\udfff"}, "model", "lone UTF-16 surrogate (\\udfff)"),
        ({"stop": ["ok", "\udc00"]}, "stop[1]", "surrogate"),
        ({"tools": [{"function": {"description": "a\x00b"}}]}, "tools[0].function.description", "NUL character"),
        ({"metadata": {"\ud800key": "value"}}, "metadata", "a key of metadata"),
        (["\ud800"], "[0]", "surrogate"),
        ("\ud800", None, "the request body: the text contains"),
        ({"a": "\ud83d"}, "a", "surrogate"),  # a high surrogate without its low half
        ({"a": "\ude00\ud83d"}, "a", "surrogate"),  # the halves in the wrong order
    ],
)
def test_invalid_text_is_found_and_named(document: object, param: str | None, needle: str) -> None:
    problem = find_body_problem(body(document))
    assert problem is not None
    assert problem.code == "invalid_text"
    assert problem.param == param
    assert needle in problem.message


@pytest.mark.parametrize(
    ("raw", "param", "name"),
    [
        (b'{"temperature": NaN}', "temperature", "NaN"),
        (b'{"tools": [{"parameters": {"maximum": Infinity}}]}', "tools[0].parameters.maximum", "Infinity"),
        (b'{"x": [1, -Infinity]}', "x[1]", "-Infinity"),
        (b"[NaN]", "[0]", "NaN"),
    ],
)
def test_non_finite_constants_are_found_and_named(raw: bytes, param: str, name: str) -> None:
    problem = find_body_problem(raw)
    assert problem is not None
    assert problem.code == "invalid_value"
    assert problem.param == param
    assert f"{name} is not a JSON number" in problem.message


def test_bytes_that_are_not_utf8_are_refused_with_their_offset() -> None:
    problem = find_body_problem(b'{"content": "caf\xe9"}')
    assert problem is not None
    assert problem.code == "invalid_text"
    assert problem.message == "the request body is not valid UTF-8 (at byte 16)"


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        json.dumps({"content": "emoji \U0001f600 as a surrogate-pair escape"}).encode(),
        json.dumps({"content": "caf\u00e9 \u4e2d\u6587"}, ensure_ascii=False).encode(),
        b'{"content": "the text \\\\ud800 is an escaped backslash, not an escape"}',
        b'{"content": "a: NaN, b: Infinity inside a string"}',
        b'{"content": "\\u0001 other control characters are ordinary text"}',
        b"not json at all: NaN",
        b'{"unfinished": "\\ud800',
    ],
)
def test_valid_text_and_non_json_pass(raw: bytes) -> None:
    assert find_body_problem(raw) is None
