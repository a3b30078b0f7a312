"""Reasoning blocks, tool-less requests, and parallel_tool_calls=False."""

from hypothesis import given, settings
from hypothesis import strategies as st

from exo.tool_calls import ToolFormatName as Format
from exo.tool_calls import ToolStreamParser

from .support import TOOLS, Fixture, assert_stream_matches, calls_of, content_of, reasoning_of, run_stream

_CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def test_tool_syntax_inside_reasoning_is_reasoning_and_a_call_after_it_is_parsed() -> None:
    thinking = 'I could emit <tool_call>{"name": "get_weather", "arguments": {}}</tool_call> here.'
    text = f"{thinking}</think>\n{_CALL}"
    fixture = Fixture("reasoning", Format.HERMES, text, [])
    chunks = assert_stream_matches(fixture, list(text), starts_in_reasoning=True)
    assert reasoning_of(chunks) == thinking
    assert calls_of(chunks) == [("get_weather", '{"city": "Paris"}')]
    assert content_of(chunks) == ""


def test_a_think_block_in_content_becomes_reasoning() -> None:
    text = "<think>plan</think>Answer: 4"
    fixture = Fixture("think", Format.HERMES, text, [])
    chunks = assert_stream_matches(fixture, list(text))
    assert (reasoning_of(chunks), content_of(chunks)) == ("plan", "Answer: 4")


def test_unterminated_reasoning_is_flushed_as_reasoning() -> None:
    text = "still thinking <tool_"
    chunks, _ = run_stream(Fixture("open", Format.HERMES, text, []), list(text), starts_in_reasoning=True)
    assert reasoning_of(chunks) == text


def test_without_reasoning_markers_think_tags_are_content() -> None:
    text = "<think>x</think>"
    chunks, _ = run_stream(Fixture("plain", Format.HERMES, text, []), [text], reasoning_markers=None)
    assert content_of(chunks) == text


def test_without_tools_everything_is_content_but_reasoning_is_still_split() -> None:
    text = f"<think>hm</think>{_CALL}"
    fixture = Fixture("no tools", Format.HERMES, text, [], tools=[])
    chunks = assert_stream_matches(fixture, list(text))
    assert calls_of(chunks) == []
    assert content_of(chunks) == _CALL
    assert reasoning_of(chunks) == "hm"


def test_parallel_tool_calls_false_stops_after_the_first_complete_call() -> None:
    parser = ToolStreamParser(Format.HERMES, TOOLS, parallel_tool_calls=False)
    chunks = []
    for character in _CALL[: -len("}</tool_call>")]:
        chunks += parser.feed(character)
    assert not parser.should_stop
    chunks += parser.feed("}</tool_call>\n" + _CALL + " trailing words")
    assert parser.should_stop
    chunks += parser.feed("more") + parser.finish()
    assert calls_of(chunks) == [("get_weather", '{"city": "Paris"}')]
    assert content_of(chunks) == ""
    assert parser.tool_calls_emitted == 1


def test_parallel_calls_are_all_kept_by_default_and_counted() -> None:
    parser = ToolStreamParser(Format.HERMES, TOOLS)
    chunks = parser.feed(_CALL + _CALL) + parser.finish()
    assert [name for name, _ in calls_of(chunks)] == ["get_weather", "get_weather"]
    assert parser.tool_calls_emitted == 2
    assert not parser.should_stop


def test_whitespace_next_to_a_call_is_markup_but_between_words_it_is_content() -> None:
    text = f"Checking the weather.\n\n{_CALL}\n"
    chunks, _ = run_stream(Fixture("ws", Format.HERMES, text, []), list(text))
    assert content_of(chunks) == "Checking the weather."
    text = "Hello \n world \n"
    chunks, _ = run_stream(Fixture("ws", Format.HERMES, text, []), list(text))
    assert content_of(chunks) == text


@given(text=st.text(max_size=200))
@settings(max_examples=200, deadline=None)
def test_without_tools_or_reasoning_markers_any_text_is_content_unchanged(text: str) -> None:
    parser = ToolStreamParser(Format.HERMES, [], reasoning_markers=None)
    chunks = [chunk for character in text for chunk in parser.feed(character)] + parser.finish()
    assert content_of(chunks) == text


@given(text=st.text(alphabet=st.characters(blacklist_characters="<{[`"), max_size=200))
@settings(max_examples=200, deadline=None)
def test_with_tools_text_without_marker_characters_is_content_unchanged(text: str) -> None:
    parser = ToolStreamParser(Format.HERMES, TOOLS)
    chunks = [chunk for character in text for chunk in parser.feed(character)] + parser.finish()
    assert content_of(chunks) == text
