"""`exo conformance`: replay sample tool calls of every format through parser and SSE encoder, check the stream.

Prints one row per case (format, case, result, first problem) or, with `--json`, a JSON document; exits 1
when any case fails, so it can gate CI or a new format plug-in.
"""

import argparse
import sys
from collections.abc import Sequence

from pydantic import TypeAdapter

from exo.conformance.checker import openai_reader
from exo.conformance.messages_contract import anthropic_reader
from exo.conformance.replay import CaseResult, replay_case
from exo.conformance.samples import all_cases
from exo.tool_calls import ToolFormatName

_PROBLEM_WIDTH = 100
_RESULTS_ADAPTER = TypeAdapter(list[CaseResult])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="exo conformance",
        description="Replay sample tool calls of every supported format through the tool parser and the SSE "
        "encoder, and check each stream against the OpenAI / AI SDK streaming contract.",
    )
    parser.add_argument(
        "--format",
        dest="formats",
        action="append",
        choices=[name.value for name in ToolFormatName],
        metavar="NAME",
        help="only this format (repeatable); one of: " + ", ".join(name.value for name in ToolFormatName),
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    return parser


def run_cases(formats: Sequence[ToolFormatName]) -> list[CaseResult]:
    """Replay every case of `formats`, in order."""
    return [replay_case(case) for case in all_cases(formats)]


def format_table(results: Sequence[CaseResult]) -> str:
    """A plain-text table: one row per case, a summary line at the end."""
    rows = [("FORMAT", "CASE", "RESULT", "PROBLEM")]
    for result in results:
        problem = result.problems[0] if result.problems else ""
        if len(result.problems) > 1:
            problem += f" (+{len(result.problems) - 1} more)"
        rows.append((result.tool_format.value, result.case, "pass" if result.passed else "FAIL", problem))
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    lines = [
        "  ".join(
            [*(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True)), row[3][:_PROBLEM_WIDTH]]
        ).rstrip()
        for row in rows
    ]
    failed = sum(not result.passed for result in results)
    lines.append(f"{len(results) - failed}/{len(results)} cases pass")
    return "\n".join([*lines, *missing_readers()])


def missing_readers() -> list[str]:
    """A line for each SDK whose second reader could not run, saying which streams were checked by rules alone."""
    lines: list[str] = []
    if openai_reader() is None:
        lines.append(
            "(openai-python is not installed: Chat Completions and Responses streams were checked against their "
            "protocols' rules alone)"
        )
    if anthropic_reader() is None:
        lines.append("(anthropic is not installed: Messages streams were checked against the protocol's rules alone)")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Run the conformance cases; return the process exit status (0 all pass, 1 otherwise)."""
    arguments = build_parser().parse_args(argv)
    selected: list[str] | None = arguments.formats
    formats = [ToolFormatName(name) for name in selected] if selected else list(ToolFormatName)
    results = run_cases(formats)
    if arguments.json:
        sys.stdout.write(_RESULTS_ADAPTER.dump_json(results, indent=2).decode() + "\n")
    else:
        sys.stdout.write(format_table(results) + "\n")
    return 0 if all(result.passed for result in results) else 1
