"""Near misses of hermes' `<tool_call>` (`<toolcall>`, `<tool-call>`, …) written as plain text: a call exactly when a
call object naming an offered tool follows, otherwise content released unchanged."""

import json
from collections.abc import Sequence

import pytest

from exo.shared.types.chunks import ParsedChunk, ToolCallChunk
from exo.tool_calls import ToolFormatName as Format
from exo.tool_calls import ToolStreamParser
from exo.tool_calls.formats.hermes import ALIAS_STARTS

from .support import TOOLS, WRITE, Fixture, assert_stream_matches, calls_of, content_of, run_stream

_CALL = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}'
_WANTED = [("get_weather", {"city": "Paris", "days": 2})]

# What the models wrote (the default 0.5B model's `<toolcall>` under opencode, the 1.5B model's `<toolCall>` closed
# by the real marker under Codex), and the other spellings the brief names.
_VARIANTS = [
    f"<toolcall>\n{_CALL}\n</toolcall>",
    f"<toolCall>\n{_CALL}\n</tool_call>",
    f"<tool-call>{_CALL}</tool-call>",
    f"<tool_calls>\n{_CALL}\n</tool_calls>",
    f"<function_call>{_CALL}</function_call>",
    f"<ToolCall> {_CALL} </ToolCall>",
]


def _decoded(chunks: Sequence[ParsedChunk]) -> list[tuple[str, object]]:
    return [(name, json.loads(arguments)) for name, arguments in calls_of(chunks)]


@pytest.mark.parametrize("tool_format", [Format.HERMES, Format.GENERIC])
@pytest.mark.parametrize("text", _VARIANTS)
@pytest.mark.parametrize("split", ["whole", "chars"])
def test_a_near_miss_marker_with_a_call_is_a_call(tool_format: Format, text: str, split: str) -> None:
    fixture = Fixture("near miss", tool_format, text, _WANTED, markers=("toolcall", "<tool", "</"))
    chunks = assert_stream_matches(fixture, [text] if split == "whole" else list(text))
    assert _decoded(chunks) == _WANTED
    assert content_of(chunks) == ""


def test_text_before_and_after_a_near_miss_call_stays_content() -> None:
    text = f"Let me look.\n<toolcall>\n{_CALL}\n</toolcall>\nDone."
    fixture = Fixture("around", Format.HERMES, text, _WANTED)
    chunks = assert_stream_matches(fixture, list(text))
    assert _decoded(chunks) == _WANTED
    assert content_of(chunks) == "Let me look.\nDone."


def test_the_reported_opencode_reply_is_a_read_call() -> None:
    read = WRITE.model_copy(update={"name": "read"})
    text = (
        '<toolcall>\n{"name": "read", "arguments": {"filePath": "calc.py", "offset": 10, "limit": 2000}}\n</toolcall>'
    )
    chunks, _ = run_stream(Fixture("opencode", Format.HERMES, text, [], tools=[read]), list(text))
    assert _decoded(chunks) == [("read", {"filePath": "calc.py", "offset": 10, "limit": 2000})]


def test_a_near_miss_call_and_a_real_one_in_one_reply() -> None:
    second = '{"name": "write", "arguments": {"path": "a", "content": "b"}}'
    text = f"<tool-call>{_CALL}</tool-call>\n<tool_call>\n{second}\n</tool_call>"
    chunks, _ = run_stream(Fixture("mixed", Format.HERMES, text, []), list(text))
    assert _decoded(chunks) == [*_WANTED, ("write", {"path": "a", "content": "b"})]
    assert content_of(chunks) == ""


@pytest.mark.parametrize(
    "text",
    [
        "Qwen sometimes writes <toolcall> instead of <tool_call>.",
        "Use <tool-call> tags.",
        "<toolcall>",
        "<toolcall>\n",
        '<toolcall>{"a": 1}</toolcall>',
        '<function_call>{"name": "Alice", "age": 30}</function_call>',
        '<toolcall>{"name": "delete_everything", "arguments": {}}</toolcall>',
        '<toolcall>{"name": "get_weather", "note": "x"}</toolcall>',
        '<function_calls><invoke name="get_weather"></invoke></function_calls>',
        "<toolcalling> and <tool_callx> are just text",
    ],
)
@pytest.mark.parametrize("split", ["whole", "chars"])
def test_a_near_miss_without_a_call_to_an_offered_tool_is_content_unchanged(text: str, split: str) -> None:
    fixture = Fixture("prose", Format.HERMES, text, [])
    chunks = assert_stream_matches(fixture, [text] if split == "whole" else list(text))
    assert calls_of(chunks) == []
    assert content_of(chunks) == text


@pytest.mark.parametrize("text", _VARIANTS)
def test_with_no_tools_offered_a_near_miss_is_content(text: str) -> None:
    fixture = Fixture("no tools", Format.HERMES, text, [], tools=[])
    chunks = assert_stream_matches(fixture, list(text))
    assert calls_of(chunks) == []
    assert content_of(chunks) == text


def test_a_near_miss_is_held_until_the_call_is_decided_then_streams() -> None:
    parser = ToolStreamParser(Format.HERMES, TOOLS)
    early = [
        chunk
        for character in 'Sure. <toolcall>\n{"name": "get_weather", "arguments"'
        for chunk in parser.feed(character)
    ]
    assert content_of(early) == "Sure.", "the near miss and the call object are held, the text before it is not"
    committed = parser.feed(": {")
    assert [type(chunk) for chunk in committed][:1] == [ToolCallChunk]
    assert calls_of(committed) == [("get_weather", "{")]


def test_every_alias_is_read() -> None:
    for alias in ALIAS_STARTS:
        text = f"{alias}{_CALL}"
        chunks, _ = run_stream(Fixture(alias, Format.HERMES, text, []), list(text))
        assert _decoded(chunks) == _WANTED, alias


@pytest.mark.parametrize(
    "text",
    [
        '<toolcall>{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}, "id": "1"}</toolcall>',
        '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}, "id": "1"}',
    ],
)
def test_a_key_after_the_arguments_of_a_strictly_read_call_is_skipped(text: str) -> None:
    # Read strictly (a near miss, a bare reply), a call stands once committed: a later key neither breaks it nor
    # leaks the rest of the object into content.
    fixture = Fixture("trailing key", Format.HERMES, text, _WANTED)
    chunks = assert_stream_matches(fixture, list(text))
    assert _decoded(chunks) == _WANTED
    assert content_of(chunks) == ""
    assert run_stream(fixture, [text])[1] == []
