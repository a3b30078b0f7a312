"""The failure rule: before commit the raw call text becomes content; after commit the call stands as written."""

import pytest

from exo.tool_calls import ToolFormatName as Format

from .support import Fixture, assert_stream_matches, calls_of, content_of, run_complete, run_stream, split_at


def _every_split_matches(fixture: Fixture) -> None:
    for cut in range(len(fixture.text) + 1):
        assert_stream_matches(fixture, split_at(fixture.text, [cut]))
    assert_stream_matches(fixture, list(fixture.text))


UNCOMMITTED = [
    (Format.HERMES, '<tool_call>{"name": "delete_everything", "arguments": {}}</tool_call>', "unknown tool"),
    (Format.HERMES, '<tool_call>{name: "get_weather"}</tool_call>', "malformed"),
    (Format.HERMES, '<tool_call>{"arguments": {"city": "Paris"}}</tool_call>', "no name"),
    (Format.HERMES, '<tool_call>{"name": "get_wea', "generation ended"),
    (Format.LLAMA3_JSON, '<|python_tag|>brave_search.call(query="x")<|eom_id|>', "expected '{'"),
    (Format.MISTRAL, '[TOOL_CALLS]launch_rockets[ARGS]{"count": 3}', "unknown tool"),
    (Format.PYTHONIC, "[launch_rockets(count=3)]", "unknown tool"),
    (Format.PYTHONIC, "[get_weather(city=", "generation ended"),
    (
        Format.QWEN3_CODER,
        "<tool_call>\n<function=launch>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
        "unknown tool",
    ),
    (Format.QWEN3_CODER, "<tool_call>\nplain words\n</tool_call>", "expected <function="),
    (Format.GLM47, "<tool_call>launch<arg_key>x</arg_key><arg_value>1</arg_value></tool_call>", "unknown tool"),
    (Format.KIMI_K2, "<|tool_calls_section_begin|>garbage<|tool_calls_section_end|>", "expected"),
]


@pytest.mark.parametrize(("tool_format", "text", "reason"), UNCOMMITTED, ids=[f"{f}-{r}" for f, _, r in UNCOMMITTED])
def test_a_call_that_fails_before_commit_comes_back_as_its_raw_text(
    tool_format: Format, text: str, reason: str
) -> None:
    fixture = Fixture("uncommitted", tool_format, text, [])
    chunks = run_complete(fixture)
    assert calls_of(chunks) == []
    assert content_of(chunks) == text
    _, failures = run_stream(fixture, [text])
    assert any(reason in failure for failure in failures), failures
    _every_split_matches(fixture)


def test_json_that_breaks_after_commit_is_sent_verbatim_and_the_call_stands() -> None:
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris" oops}}</tool_call>after'
    fixture = Fixture("broken", Format.HERMES, text, [])
    chunks = run_complete(fixture)
    assert calls_of(chunks) == [("get_weather", '{"city": "Paris" oops}}')]
    assert content_of(chunks) == "after"
    _, failures = run_stream(fixture, [text])
    assert any("stopped being JSON" in failure for failure in failures)
    _every_split_matches(fixture)


@pytest.mark.parametrize(
    ("tool_format", "text", "arguments"),
    [
        (
            Format.HERMES,
            '<tool_call>{"name": "write", "arguments": {"path": "a", "content": "abc',
            '{"path": "a", "content": "abc',
        ),
        (Format.HERMES, '<tool_call>{"name": "get_weather", "arguments": {"days": 1', '{"days": 1'),
        (Format.MISTRAL, '[TOOL_CALLS]write[ARGS]{"path": "a", "content": "ab', '{"path": "a", "content": "ab'),
        (Format.QWEN3_CODER, "<function=write>\n<parameter=content>\nhello wor", '{"content": "hello wor'),
    ],
)
def test_generation_ending_inside_a_committed_call_keeps_what_was_written(
    tool_format: Format, text: str, arguments: str
) -> None:
    fixture = Fixture("truncated", tool_format, text, [])
    chunks, failures = run_stream(fixture, list(text))
    assert calls_of(chunks) == [(calls_of(chunks)[0][0], arguments)]
    assert content_of(chunks) == ""
    assert any("ended inside" in failure for failure in failures)
    _every_split_matches(fixture)


def test_a_schema_violation_keeps_the_call_and_reports_it() -> None:
    text = '<tool_call>{"name": "get_weather", "arguments": {"days": 2}}</tool_call>'
    fixture = Fixture("schema", Format.HERMES, text, [])
    chunks, failures = run_stream(fixture, [text])
    assert calls_of(chunks) == [("get_weather", '{"days": 2}')]
    assert any("'city' is a required property" in failure for failure in failures)


def test_stray_text_after_a_complete_call_is_content_not_lost() -> None:
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}}\n</tool_call>'
    fixture = Fixture("stray", Format.HERMES, text, [])
    chunks, failures = run_stream(fixture, [text])
    assert calls_of(chunks) == [("get_weather", '{"city": "Paris"}')]
    assert content_of(chunks) == "}"
    assert failures
    _every_split_matches(fixture)


# Replies with no call marker that only began like a bare call: ordinary content, in full, and no failure (a coding
# model starts many answers with a code fence; each one used to be logged as a tool call "not parsed as intended").
NEVER_CALLS = [
    (Format.HERMES, "```python\nprint('hi')\n```\nThat prints hi."),
    (Format.HERMES, "```json\n```\nNothing to show."),
    (Format.HERMES, '{"a": 1, "b": [2, 3]}'),
    (Format.HERMES, '{"type": "object", "properties": {}}'),
    (Format.HERMES, "[1, 2, 3] are the first numbers."),
    (Format.HERMES, "``"),
    (Format.LLAMA3_JSON, '```\n{"a": 1}\n```'),
    (Format.LLAMA3_JSON, '{"result": 42}'),
    (Format.PYTHONIC, "[the docs](https://example.com) say so."),
    (Format.PYTHONIC, "[1, 2, 3]"),
    (Format.PYTHONIC, "[unfinished"),
]


@pytest.mark.parametrize(("tool_format", "text"), NEVER_CALLS, ids=[f"{f}-{t[:12]}" for f, t in NEVER_CALLS])
def test_a_reply_that_only_began_like_a_bare_call_is_content_and_no_failure(tool_format: Format, text: str) -> None:
    fixture = Fixture("not a call", tool_format, text, [])
    chunks = run_complete(fixture)
    assert calls_of(chunks) == []
    assert content_of(chunks) == text
    _, failures = run_stream(fixture, list(text))
    assert failures == []
    _every_split_matches(fixture)


def test_an_empty_fence_before_a_real_call_is_content_and_the_call_is_parsed_without_failure() -> None:
    # What qwen2.5-coder-0.5b wrote under opencode: an empty ```json fence, then a proper <tool_call>.
    call = '<tool_call>\n{"name": "write", "arguments": {"path": "hello.txt", "content": "hello"}}\n</tool_call>'
    text = f"```json\n```\n{call}"
    fixture = Fixture("fence then call", Format.HERMES, text, [])
    chunks, failures = run_stream(fixture, list(text))
    assert calls_of(chunks) == [("write", '{"path": "hello.txt", "content": "hello"}')]
    assert content_of(chunks) == "```json\n```"
    assert failures == []
    _every_split_matches(fixture)


BARE_FAILED_CALLS = [
    (Format.HERMES, '{"name": "launch_rockets", "arguments": {}}', "unknown tool"),
    (Format.HERMES, '```json\n{"arguments": {"city": "Paris"}}\n```', "no name"),
    (Format.LLAMA3_JSON, '{"name": "get_wea', "generation ended"),
    (Format.PYTHONIC, "[launch_rockets(count=3)]", "unknown tool"),
]


@pytest.mark.parametrize(("tool_format", "text", "reason"), BARE_FAILED_CALLS, ids=[r for _, _, r in BARE_FAILED_CALLS])
def test_a_bare_reply_that_began_as_a_call_still_reports_why_it_failed(
    tool_format: Format, text: str, reason: str
) -> None:
    fixture = Fixture("bare failed call", tool_format, text, [])
    assert calls_of(run_complete(fixture)) == []
    assert content_of(run_complete(fixture)) == text
    _, failures = run_stream(fixture, [text])
    assert any(reason in failure for failure in failures), failures
