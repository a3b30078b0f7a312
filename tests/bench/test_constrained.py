"""Section 5: constrained-decoding verdicts, its rendering, old reports without it, and `--only` on the fixture."""

from pathlib import Path

import pytest

from bench.__main__ import QUICK_MODEL, main
from bench.report import render_markdown
from bench.results import BenchReport, ConstrainedDecodeRow, ConstrainedReport, GrammarCompileRow
from bench.settings import CONSTRAINED_FULL
from bench.targets import check_constrained_decode, check_targets
from tests.bench.test_render import sample_report


def _decode_row(
    mode: str, ms: float, *, constrained: bool, same: bool = True, text: str = '<tool_call>\n{"name": "write"}'
) -> ConstrainedDecodeRow:
    return ConstrainedDecodeRow(
        mode=mode,
        constrained=constrained,
        ms_per_token=[ms + 1.0, ms, ms - 1.0],
        median_ms_per_token=ms,
        completion_tokens=48,
        same_tokens_as_unconstrained=same,
        text=text,
    )


def sample_section(required_ms: float, named_ms: float) -> ConstrainedReport:
    """A section whose unconstrained median is 200 ms per token."""
    return ConstrainedReport(
        settings=CONSTRAINED_FULL,
        tool_format="hermes",
        prompt_tokens=5000,
        vocabulary_size=151_665,
        decode=[
            _decode_row("tool_choice auto (unconstrained)", 200.0, constrained=False, text="```json\n| a |"),
            _decode_row('tool_choice "required"', required_ms, constrained=True),
            _decode_row('tool_choice named "write"', named_ms, constrained=True, same=False),
        ],
        first_request_ms=1234.0,
        tokenizer_build_ms=1100.0,
        compile=[
            GrammarCompileRow(
                mode='tool_choice "required", 10 tools', tool_count=10, schema_chars=20_491, cold_ms=6.5, cached_ms=0.25
            )
        ],
        load_average=(3.5, 3.0, 2.5),
        exo_commit="abc1234",
    )


def test_the_slowest_constrained_mode_within_ten_percent_meets_the_target() -> None:
    check = check_constrained_decode(sample_section(required_ms=210.0, named_ms=218.0))
    assert check.met
    assert check.measured == "worst 1.090×"
    assert 'named "write" takes 218.0 ms per token' in check.why


def test_a_constrained_mode_more_than_ten_percent_slower_misses_the_target() -> None:
    check = check_constrained_decode(sample_section(required_ms=225.0, named_ms=205.0))
    assert not check.met
    assert check.measured == "worst 1.125×"
    assert '"required" takes 225.0 ms' in check.why


def test_constrained_runs_far_faster_than_unconstrained_are_called_noise() -> None:
    check = check_constrained_decode(sample_section(required_ms=170.0, named_ms=160.0))
    assert check.met
    assert "uneven load" in check.why


def test_rendered_report_has_section_five_and_its_target() -> None:
    report = sample_report(load_1=0.2).model_copy(update={"constrained": sample_section(210.0, 218.0)})
    document = render_markdown(report, [])
    assert "## 5. Grammar-constrained decoding" in document
    assert "3 of 5 targets met." in document
    assert '| tool_choice named "write" | 218.0 | 1.090× | 219.0, 218.0, 217.0 | 48 | no |' in document
    # Pipes in a reply must not break the table, nor its code fence close the excerpt's code span.
    assert "| ```` ```json\\n\\| a \\| ```` |" in document
    assert '| tool_choice "required", 10 tools | 10 | 20,491 | 6.50 | 0.250 |' in document
    assert "**1234 ms**" in document


def test_a_report_saved_before_section_five_still_loads_and_renders_four_targets() -> None:
    saved = sample_report(load_1=0.2).model_dump(exclude={"constrained"})
    report = BenchReport.model_validate(saved)
    assert report.constrained is None
    assert len(check_targets(report)) == 4
    assert "## 5." not in render_markdown(report, [])


def test_only_without_base_is_refused() -> None:
    with pytest.raises(SystemExit):
        main(["--only", "constrained"])


def test_only_constrained_measures_the_fixture_model_and_keeps_the_base_numbers(tmp_path: Path) -> None:
    base = sample_report(load_1=0.2).model_copy(update={"model_id": "tiny-qwen-tools", "model_path": str(QUICK_MODEL)})
    base_path, merged_path = tmp_path / "base.json", tmp_path / "merged.json"
    base_path.write_text(base.model_dump_json())
    output = tmp_path / "out" / "PERFORMANCE.md"
    # --output always: the default is the repository's own docs/PERFORMANCE.md.
    command = ["--only", "constrained", "--quick", "--base", str(base_path), "--results-json", str(merged_path)]
    main([*command, "--output", str(output)])
    merged = BenchReport.model_validate_json(merged_path.read_text())
    assert merged.model_copy(update={"constrained": None, "runs": {}}) == base
    run = merged.runs["constrained"]
    assert run.command == " ".join(["uv run python -m bench", *command, "--output", str(output)])
    section = merged.constrained
    assert section is not None
    assert section.tool_format == "hermes"
    unconstrained, *constrained = section.decode
    assert not unconstrained.constrained
    for row in constrained:
        # The grammar admits only a call to an offered tool: the fixture's prompt offers `write` alone.
        assert row.text.startswith('<tool_call>\n{"name": "write", "arguments": {'), row.text
        assert row.median_ms_per_token > 0
    for compiled in section.compile:
        assert compiled.cached_ms < compiled.cold_ms
    assert section.compile[0].tool_count == 10
    assert "## 5. Grammar-constrained decoding" in output.read_text()
