"""Random outputs built from each format's own pieces: any split streams to the non-streaming result."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exo.tool_calls import ToolFormatName as Format

from .fixtures import FIXTURES
from .support import Fixture, assert_stream_matches, split_at

_COMMON = [
    "{",
    "}",
    "[",
    "]",
    '"',
    ":",
    ",",
    " ",
    "\n",
    "\\",
    "x",
    "5",
    "true",
    '"name"',
    '"arguments"',
    '"get_weather"',
    '"city"',
    '"Paris"',
    '"days"',
    '"3"',
    "<",
    ">",
    "<think>",
    "</think>",
    "```json",
    "```",
    ";",
]
_FORMAT_PIECES = {
    Format.HERMES: ["<tool_call>", "</tool_call>", "<tool_", "call>", '"parameters"'],
    Format.LLAMA3_JSON: ["<|python_tag|>", "<|eom_id|>", "<|eot_id|>", "<|", '"parameters"'],
    Format.MISTRAL: ["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "get_weather", "[TOOL_"],
    Format.PYTHONIC: [
        "<|tool_call_start|>",
        "<|tool_call_end|>",
        "get_weather(",
        "city=",
        "'Rome'",
        ")",
        "<|python_tag|>",
    ],
    Format.QWEN3_CODER: [
        "<tool_call>",
        "</tool_call>",
        "<function=",
        "get_weather",
        "</function>",
        "<parameter=",
        "city",
        "days",
        "</parameter>",
        "<function=get_weather>",
        "<parameter=days>",
    ],
    Format.GLM47: [
        "<tool_call>",
        "</tool_call>",
        "get_weather",
        "<arg_key>",
        "</arg_key>",
        "<arg_value>",
        "</arg_value>",
    ],
    Format.GEMMA4: ["<|tool_call>", "<tool_call|>", "call:get_weather", "city:", '<|"|>'],
}


@pytest.mark.parametrize("tool_format", list(_FORMAT_PIECES))
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_random_outputs_stream_like_they_parse_whole(tool_format: Format, data: st.DataObject) -> None:
    # Whole well-formed calls of this format, cut into halves, mixed with its markers and JSON debris.
    whole = [fixture.text for fixture in FIXTURES if fixture.tool_format == tool_format]
    halves = [half for text in whole for half in (text[: len(text) // 2], text[len(text) // 2 :])]
    alphabet = _COMMON + _FORMAT_PIECES[tool_format] + whole + halves
    pieces = data.draw(st.lists(st.sampled_from(alphabet), max_size=30))
    text = "".join(pieces)
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=len(text)), max_size=10))
    starts_in_reasoning = data.draw(st.booleans())
    fixture = Fixture("fuzz", tool_format, text, [])
    assert_stream_matches(fixture, split_at(text, cuts), starts_in_reasoning=starts_in_reasoning)
    assert_stream_matches(fixture, list(text), starts_in_reasoning=starts_in_reasoning)
