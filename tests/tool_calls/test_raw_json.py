"""Bare JSON replies: a call only when the whole reply is one; JSON the user asked for stays content."""

import pytest

from exo.shared.types.chunks import TokenChunk, ToolCallChunk
from exo.tool_calls import ToolFormatName as Format
from exo.tool_calls import ToolStreamParser

from .support import TOOLS, Fixture, assert_stream_matches, calls_of, content_of


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1}',
        '{"name": "Alice", "age": 30}',
        '{"name": "unknown_tool", "arguments": {}}',
        "[1, 2, 3]",
        '[{"id": 1}]',
        "```python\nprint('hi')\n```",
        '```json\n{"result": true}\n```',
        'Here it is: {"name": "get_weather", "arguments": {"city": "Paris"}}',
        '{"name": "get_weather", "note": "x"}',
    ],
)
@pytest.mark.parametrize("tool_format", [Format.HERMES, Format.LLAMA3_JSON])
def test_json_that_is_not_a_whole_reply_call_stays_content(tool_format: Format, text: str) -> None:
    fixture = Fixture("user json", tool_format, text, [])
    chunks = assert_stream_matches(fixture, list(text))
    assert calls_of(chunks) == []
    assert content_of(chunks) == text


def test_with_no_tools_a_call_shaped_reply_is_content() -> None:
    text = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    fixture = Fixture("no tools", Format.HERMES, text, [], tools=[])
    assert content_of(assert_stream_matches(fixture, list(text))) == text


def test_a_bare_reply_is_held_until_decided_then_committed_early() -> None:
    parser = ToolStreamParser(Format.HERMES, TOOLS)
    prefix = '{"name": "get_weather", "arguments"'
    early = [chunk for character in prefix for chunk in parser.feed(character)]
    assert early == [], "nothing is emitted while the reply might still be plain JSON"
    committed = parser.feed(": ")
    assert [type(chunk) for chunk in committed] == [ToolCallChunk]
    after = parser.feed('{"city": "Pa')
    assert after
    assert not any(isinstance(chunk, TokenChunk) for chunk in after)


def test_plain_json_is_released_as_soon_as_its_first_key_rules_out_a_call() -> None:
    parser = ToolStreamParser(Format.HERMES, TOOLS)
    chunks = [chunk for character in '{"a": 1, "b": ' for chunk in parser.feed(character)]
    assert content_of(chunks) == '{"a": 1, "b":'
