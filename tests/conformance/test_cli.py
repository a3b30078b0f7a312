"""`exo conformance` passes every format with the real pipeline and catches a broken encoder or parser."""

import subprocess
import sys
from collections.abc import Callable

import pytest
from pydantic import BaseModel, TypeAdapter

from exo.api.adapters.chat_stream import ChunkEncoder
from exo.conformance import cli
from exo.conformance.replay import replay_case
from exo.conformance.samples import PARIS, ConformanceCase, cases_for
from exo.shared.types.chunks import Chunk, ToolCallArgumentsChunk, ToolCallChunk
from exo.tool_calls import ToolFormatName


class ReportedCase(BaseModel):
    """One row of `exo conformance --json`."""

    tool_format: str
    case: str
    problems: list[str]
    passed: bool


_REPORT = TypeAdapter(list[ReportedCase])


def run_json(capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, list[ReportedCase]]:
    status = cli.main([*arguments, "--json"])
    return status, _REPORT.validate_json(capsys.readouterr().out)


def test_every_format_passes_every_case(capsys: pytest.CaptureFixture[str]) -> None:
    status, results = run_json(capsys)
    assert status == 0
    assert {result.tool_format for result in results} == {name.value for name in ToolFormatName}
    failed = [result for result in results if not result.passed]
    assert failed == []
    cases = {result.case for result in results}
    assert {
        "single",
        "parallel",
        "after_content",
        "split_segments",
        "after_reasoning",
        "think_after_content",
        "think_after_call",
        "unknown_tool",
    } <= cases


def test_format_option_restricts_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    status, results = run_json(capsys, "--format", "kimi_k2", "--format", "gemma4")
    assert status == 0
    assert {result.tool_format for result in results} == {"kimi_k2", "gemma4"}


def test_the_table_has_a_row_per_case_and_a_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--format", "mistral"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["FORMAT", "CASE", "RESULT", "PROBLEM"]
    cases = cases_for(ToolFormatName.MISTRAL)
    assert len(lines) == len(cases) + 2
    assert lines[-1] == f"{len(cases)}/{len(cases)} cases pass"


def test_python_dash_m_exo_conformance_runs_as_a_command() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "exo", "conformance", "--format", "hermes", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    results = _REPORT.validate_json(completed.stdout)
    assert [result.case for result in results] == [case.case for case in cases_for(ToolFormatName.HERMES)]


def _break_encoder(monkeypatch: pytest.MonkeyPatch, rewrite: Callable[[Chunk], Chunk]) -> None:
    original = ChunkEncoder.encode

    def encode(self: ChunkEncoder, chunk: Chunk) -> list[str]:
        return original(self, rewrite(chunk))

    monkeypatch.setattr(ChunkEncoder, "encode", encode)


def test_an_encoder_that_repeats_role_fails_the_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    original = ChunkEncoder.encode

    def encode_with_role(self: ChunkEncoder, chunk: Chunk) -> list[str]:
        return [event.replace('"delta":{', '"delta":{"role":"assistant",', 1) for event in original(self, chunk)]

    monkeypatch.setattr(ChunkEncoder, "encode", encode_with_role)
    status, results = run_json(capsys, "--format", "hermes")
    assert status == 1
    assert all(not result.passed for result in results)
    problems = [problem for result in results for problem in result.problems]
    assert any("2-role-once" in problem for problem in problems)


def test_an_encoder_that_puts_every_call_at_index_0_fails_parallel_cases(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def collapse(chunk: Chunk) -> Chunk:
        if isinstance(chunk, ToolCallChunk | ToolCallArgumentsChunk):
            return chunk.model_copy(update={"index": 0})
        return chunk

    _break_encoder(monkeypatch, collapse)
    status, results = run_json(capsys, "--format", "qwen3_coder")
    verdicts = {result.case: result.passed for result in results}
    assert status == 1
    assert verdicts == {
        "single": True,
        "parallel": False,
        "after_content": True,
        "split_segments": False,
        "after_reasoning": True,
        "think_after_content": True,
        "think_after_call": True,
        "unknown_tool": True,
    }


def test_output_in_another_format_is_reported_as_missing_calls() -> None:
    hermes_text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    case = ConformanceCase(tool_format=ToolFormatName.MISTRAL, case="wrong", segments=(hermes_text,), calls=(PARIS,))
    result = replay_case(case)
    assert not result.passed
    assert any(problem.startswith("calls []") for problem in result.problems)
    assert any(problem.startswith("content ") for problem in result.problems)


def test_a_case_marked_malformed_must_be_refused_by_the_parser() -> None:
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    case = ConformanceCase(
        tool_format=ToolFormatName.HERMES, case="not really", segments=(text,), calls=(), content=text, malformed=True
    )
    problems = replay_case(case).problems
    assert "parser: a malformed call was not noted as a failure" in problems
