"""Format-specific behaviour beyond the shared fixtures."""

from exo.tool_calls import ToolFormatName as Format

from .support import Fixture, assert_stream_matches, calls_of, content_of, run_stream


def test_an_mlx_lm_format_ended_by_eos_instead_of_its_end_marker_still_parses() -> None:
    text = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
    fixture = Fixture("glm eos", Format.GLM47, text, [])
    chunks = assert_stream_matches(fixture, list(text))
    assert calls_of(chunks) == [("get_weather", '{"city": "Paris"}')]


def test_llama_raw_json_with_a_type_key_is_a_call() -> None:
    text = '{"type": "function", "name": "get_weather", "parameters": {"city": "Paris"}}'
    fixture = Fixture("llama type", Format.LLAMA3_JSON, text, [])
    chunks = assert_stream_matches(fixture, list(text))
    assert calls_of(chunks) == [("get_weather", '{"city": "Paris"}')]


def test_a_json_schema_the_user_asked_for_stays_content() -> None:
    text = '{"type": "object", "properties": {"name": {"type": "string"}}}'
    fixture = Fixture("schema reply", Format.LLAMA3_JSON, text, [])
    chunks = assert_stream_matches(fixture, list(text))
    assert (calls_of(chunks), content_of(chunks)) == ([], text)


def test_mistral_list_with_a_bad_second_call_keeps_the_first_and_returns_the_rest_as_content() -> None:
    text = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "nope", "arguments": {}}]'
    fixture = Fixture("mistral partial", Format.MISTRAL, text, [])
    chunks = assert_stream_matches(fixture, list(text))
    assert calls_of(chunks) == [("get_weather", '{"city": "Paris"}')]
    assert content_of(chunks) == ', {"name": "nope", "arguments": {}}]'
    _, failures = run_stream(fixture, [text])
    assert any("unknown tool 'nope'" in failure for failure in failures)


def test_pythonic_markdown_link_at_the_start_is_content() -> None:
    text = "[the docs](https://example.com) say hello"
    fixture = Fixture("link", Format.PYTHONIC, text, [])
    chunks = assert_stream_matches(fixture, list(text))
    assert (calls_of(chunks), content_of(chunks)) == ([], text)
