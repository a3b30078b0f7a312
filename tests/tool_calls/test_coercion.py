"""Schema-directed coercion: only unambiguous mismatches are converted, and nothing is ever invented."""

import json

import pytest

from exo.shared.types.tool_spec import ToolSpec
from exo.tool_calls import ToolFormatName as Format

from .support import Fixture, assert_stream_matches, calls_of, run_complete, run_stream

SCHEMA_TOOL = ToolSpec(
    name="configure",
    parameters={
        "type": "object",
        "$defs": {"Limit": {"type": "integer"}},
        "properties": {
            "count": {"type": "integer"},
            "ratio": {"type": "number"},
            "enabled": {"type": "boolean"},
            "label": {"type": "string"},
            "settings": {"type": "object"},
            "tags": {"type": "array", "items": {"type": "integer"}},
            "limit": {"$ref": "#/$defs/Limit"},
            "either": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
            "nested": {"type": "object", "properties": {"depth": {"type": "integer"}}},
        },
    },
)


def _arguments(raw_arguments: str) -> dict[str, object]:
    text = f'<tool_call>{{"name": "configure", "arguments": {raw_arguments}}}</tool_call>'
    fixture = Fixture("coercion", Format.HERMES, text, [], tools=[SCHEMA_TOOL])
    assert_stream_matches(fixture, list(text))
    [(_, arguments)] = calls_of(run_complete(fixture))
    return json.loads(arguments)


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        ('{"count": "5"}', {"count": 5}),
        ('{"count": 5.0}', {"count": 5}),
        ('{"ratio": "2.5"}', {"ratio": 2.5}),
        ('{"enabled": "true"}', {"enabled": True}),
        ('{"enabled": "False"}', {"enabled": False}),
        ('{"settings": "{\\"a\\": 1}"}', {"settings": {"a": 1}}),
        ('{"tags": "[1, 2]"}', {"tags": [1, 2]}),
        ('{"tags": ["1", 2]}', {"tags": [1, 2]}),
        ('{"limit": "7"}', {"limit": 7}),
        ('{"nested": {"depth": "4"}}', {"nested": {"depth": 4}}),
    ],
)
def test_unambiguous_mismatches_are_coerced(written: str, expected: dict[str, object]) -> None:
    assert _arguments(written) == expected


@pytest.mark.parametrize(
    "written",
    [
        '{"count": "5.5"}',
        '{"count": "five"}',
        '{"enabled": "yes"}',
        '{"settings": "not json"}',
        '{"settings": "[1]"}',
        '{"label": "5"}',
        '{"label": 5}',
        '{"either": "5"}',
        '{"unknown": "5"}',
        "{}",
    ],
)
def test_ambiguous_or_matching_values_are_left_as_written(written: str) -> None:
    assert _arguments(written) == json.loads(written)


def test_strings_stream_char_by_char_but_a_coerced_value_arrives_whole() -> None:
    text = '<tool_call>{"name": "configure", "arguments": {"label": "XYZQW", "count": "12345"}}</tool_call>'
    fixture = Fixture("fragments", Format.HERMES, text, [], tools=[SCHEMA_TOOL])
    chunks, _ = run_stream(fixture, list(text))
    fragments = [chunk.fragment for chunk in chunks if chunk.kind == "tool_call_arguments"]
    assert "12345" in fragments
    assert not any("123" in fragment and fragment != "12345" for fragment in fragments)
    assert [fragment for fragment in fragments if fragment and fragment in "XYZQW"] == list("XYZQW")


def test_qwen3_coder_values_are_converted_per_schema_without_inventing() -> None:
    text = (
        "<function=configure>\n<parameter=count>\n5.0\n</parameter>\n<parameter=ratio>\n0.5\n</parameter>\n"
        "<parameter=enabled>\nmaybe\n</parameter>\n<parameter=settings>\n{'k': [1, 'x']}\n</parameter>\n"
        "<parameter=label>\n42\n</parameter>\n<parameter=tags>\nnot a list\n</parameter>\n</function>"
    )
    fixture = Fixture("xml", Format.QWEN3_CODER, text, [], tools=[SCHEMA_TOOL])
    assert_stream_matches(fixture, list(text))
    [(_, arguments)] = calls_of(run_complete(fixture))
    assert json.loads(arguments) == {
        "count": 5,
        "ratio": 0.5,
        "enabled": "maybe",
        "settings": {"k": [1, "x"]},
        "label": "42",
        "tags": "not a list",
    }


def test_qwen3_coder_non_integral_float_is_not_forced_into_an_integer() -> None:
    text = "<function=configure>\n<parameter=count>\n5.5\n</parameter>\n</function>"
    fixture = Fixture("xml", Format.QWEN3_CODER, text, [], tools=[SCHEMA_TOOL])
    [(_, arguments)] = calls_of(run_complete(fixture))
    assert json.loads(arguments) == {"count": "5.5"}


def test_raw_control_characters_in_strings_become_escapes_of_the_same_value() -> None:
    text = '<tool_call>{"name": "configure", "arguments": {"label": "a\nb\tc"}}</tool_call>'
    fixture = Fixture("control", Format.HERMES, text, [], tools=[SCHEMA_TOOL])
    assert_stream_matches(fixture, list(text))
    [(_, arguments)] = calls_of(run_complete(fixture))
    assert arguments == '{"label": "a\\nb\\tc"}'
