"""Reasoning opens only at the start of the reply: after content or a call, think markers are plain content."""

from exo.tool_calls import ToolFormatName as Format

from .support import Fixture, assert_stream_matches, calls_of, content_of, reasoning_of, split_at

_CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def _every_split(fixture: Fixture, **options: object) -> None:
    """Stream `fixture` one character at a time and cut at every single position; all must give the same chunks."""
    assert_stream_matches(fixture, list(fixture.text), **options)
    for cut in range(1, len(fixture.text)):
        assert_stream_matches(fixture, split_at(fixture.text, [cut]), **options)


def test_think_markers_after_content_are_content() -> None:
    text = "Sure, here it is. <think>second thoughts</think> Done."
    fixture = Fixture("late think", Format.HERMES, text, [])
    _every_split(fixture)
    opening, closing = text.index("<think>"), text.index("</think>")
    chunks = assert_stream_matches(fixture, split_at(text, [opening + 3, closing + 4]))  # "<thi|nk>", "</thi|nk>"
    assert (content_of(chunks), reasoning_of(chunks)) == (text, "")


def test_think_markers_after_a_tool_call_are_content() -> None:
    text = f"{_CALL}<think>that should do</think>"
    fixture = Fixture("think after call", Format.HERMES, text, [])
    _every_split(fixture)
    chunks = assert_stream_matches(fixture, list(text))
    assert calls_of(chunks) == [("get_weather", '{"city": "Paris"}')]
    assert (content_of(chunks), reasoning_of(chunks)) == ("<think>that should do</think>", "")


def test_a_call_after_a_late_think_marker_is_a_call_not_hidden_reasoning() -> None:
    text = f"Checking. <think>{_CALL}</think>"
    fixture = Fixture("call in late think", Format.HERMES, text, [])
    _every_split(fixture)
    chunks = assert_stream_matches(fixture, list(text))
    assert calls_of(chunks) == [("get_weather", '{"city": "Paris"}')]
    assert (content_of(chunks), reasoning_of(chunks)) == ("Checking. <think></think>", "")


def test_think_after_a_rejected_call_is_content() -> None:
    rejected = '<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>'
    text = f"{rejected}<think>x</think>"
    fixture = Fixture("think after raw call", Format.HERMES, text, [])
    _every_split(fixture)
    chunks = assert_stream_matches(fixture, list(text))
    assert (content_of(chunks), reasoning_of(chunks), calls_of(chunks)) == (text, "", [])


def test_leading_whitespace_does_not_stop_reasoning_from_opening() -> None:
    text = "\n <think>plan</think>Answer: 4"
    fixture = Fixture("whitespace first", Format.HERMES, text, [])
    _every_split(fixture)
    chunks = assert_stream_matches(fixture, list(text))
    assert (reasoning_of(chunks), content_of(chunks).strip()) == ("plan", "Answer: 4")


def test_reasoning_opened_by_the_template_ends_once_and_later_markers_are_content() -> None:
    text = "plan</think>Answer: 4 <think>again</think>"
    fixture = Fixture("template opened", Format.HERMES, text, [])
    _every_split(fixture, starts_in_reasoning=True)
    chunks = assert_stream_matches(fixture, list(text), starts_in_reasoning=True)
    assert (reasoning_of(chunks), content_of(chunks)) == ("plan", "Answer: 4 <think>again</think>")


def test_without_tools_think_after_content_is_content_too() -> None:
    text = "Hello <think>hidden?</think>"
    fixture = Fixture("no tools", Format.HERMES, text, [], tools=[])
    _every_split(fixture)
    chunks = assert_stream_matches(fixture, list(text))
    assert (content_of(chunks), reasoning_of(chunks)) == (text, "")
