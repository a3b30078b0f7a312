"""For every format: streamed at any split, the chunks merge to the non-streaming result and keep the contract."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from .fixtures import FIXTURES
from .support import (
    Fixture,
    assert_stream_matches,
    calls_of,
    content_of,
    parses,
    reasoning_of,
    run_complete,
    run_stream,
    split_at,
)

_IDS = [fixture.name for fixture in FIXTURES]


@pytest.mark.parametrize("fixture", FIXTURES, ids=_IDS)
def test_non_streaming_result_is_what_the_model_meant(fixture: Fixture) -> None:
    chunks = run_complete(fixture)
    calls = calls_of(chunks)
    assert [(name, json.loads(arguments)) for name, arguments in calls] == fixture.calls
    assert content_of(chunks) == fixture.content
    assert reasoning_of(chunks) == fixture.reasoning
    _, failures = run_stream(fixture, [fixture.text])
    assert failures == []


@pytest.mark.parametrize("fixture", FIXTURES, ids=_IDS)
def test_every_single_split_position_gives_the_same_result(fixture: Fixture) -> None:
    for cut in range(len(fixture.text) + 1):
        assert_stream_matches(fixture, split_at(fixture.text, [cut]))


@pytest.mark.parametrize("fixture", FIXTURES, ids=_IDS)
def test_one_character_at_a_time_gives_the_same_result(fixture: Fixture) -> None:
    assert_stream_matches(fixture, list(fixture.text))


@pytest.mark.parametrize("fixture", FIXTURES, ids=_IDS)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_random_multi_splits_give_the_same_result(fixture: Fixture, data: st.DataObject) -> None:
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=len(fixture.text)), max_size=12))
    assert_stream_matches(fixture, split_at(fixture.text, cuts))


@pytest.mark.parametrize("fixture", [fixture for fixture in FIXTURES if fixture.calls], ids=lambda f: f.name)
def test_arguments_stream_before_the_call_ends(fixture: Fixture) -> None:
    """Streamed char by char, each call's arguments arrive as JSON only at the last fragment."""
    streamed, _ = run_stream(fixture, list(fixture.text))
    for _, arguments in calls_of(streamed):
        assert parses(arguments)
        assert not any(parses(arguments[:end]) for end in range(len(arguments)))
