"""The prompt-layout report: verdicts per layout, agreement counted on text and calls, the cache table."""

from typing import Any

from bench.prompt_layout import CacheRow, Report, layout_row, markdown, reply_of
from bench.results import SectionRun


def _answer(content: str | None, calls: list[tuple[str, str]]) -> dict[str, Any]:
    tool_calls = [{"function": {"name": name, "arguments": arguments}} for name, arguments in calls]
    return {"choices": [{"message": {"content": content, "tool_calls": tool_calls or None}}]}


def test_replies_agree_on_text_and_calls_and_each_layout_is_judged_on_its_own() -> None:
    valid = _answer(None, [("get_weather", '{"city": "Paris", "unit": "celsius"}')])
    invalid = _answer(None, [("get_weather", '{"city": "Rome", "unit": "celsius"}')])
    prose = _answer("It is sunny.", [])

    assert reply_of(valid) == reply_of(_answer("", [("get_weather", '{"city": "Paris", "unit": "celsius"}')]))
    assert reply_of(valid) != reply_of(invalid)
    row = layout_row("tools-first", [valid, invalid, prose])
    assert (row.valid, row.invalid, row.no_call) == (1, 1, 1)
    assert row.problems[0].startswith("get_weather: 'Rome' is not one of")


def test_the_markdown_names_the_run_and_every_figure() -> None:
    report = Report(
        run=SectionRun(
            exo_commit="abc1234", cpu="2 × cpu", load_average=(3.0, 2.0, 1.0), command="c", finished_utc="t"
        ),
        load_at_start=(4.0, 3.0, 2.0),
        model="m",
        prompts=12,
        validity=[layout_row("template", []), layout_row("tools-first", [])],
        same_replies=11,
        cache=[
            CacheRow(layout="template", prompt_tokens=700, cached_tokens_in_second_folder=20),
            CacheRow(layout="tools-first", prompt_tokens=700, cached_tokens_in_second_folder=650),
        ],
    )
    text = markdown(report)
    assert "Commit abc1234, 2 × cpu, model m" in text
    assert "load average 4.0 / 3.0 / 2.0 at the start, 3.0 / 2.0 / 1.0 at the end" in text
    assert "over 12 of the corpus's 43 prompts (numbers 1–12)" in text
    assert "Same reply (text and calls) in both layouts: 11/12." in text
    assert "Prompt 1 in one folder, then in another" in text
    assert "| tools-first | 700 | 650 |" in text


def test_a_run_in_pieces_names_the_corpus_prompts_it_measured() -> None:
    report = Report(
        run=SectionRun(exo_commit="abc1234", cpu="c", load_average=(1.0, 1.0, 1.0), command="c", finished_utc="t"),
        load_at_start=(1.0, 1.0, 1.0),
        model="m",
        prompts=20,
        first_prompt=14,
        validity=[layout_row("template", []), layout_row("tools-first", [])],
        same_replies=19,
        different_replies=[22],
        cache=[],
    )
    text = markdown(report)
    assert "over 20 of the corpus's 43 prompts (numbers 14–33)" in text
    assert "Same reply (text and calls) in both layouts: 19/20 (different: 22)." in text
    assert "Prompt 14 in one folder, then in another" in text
