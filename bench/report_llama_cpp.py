"""Markdown for `bench.llama_cpp`: one row per measure, one column per system, and each exo system ÷ llama.cpp.

A system asked for that did not start keeps its column, `not started` in every cell, and a bold line says why: a
reader of the table sees what was missing, not a comparison that quietly shrank."""

import statistics

from bench.llama_cpp import (
    EXO_SYSTEMS,
    LLAMA_CONTEXT,
    LLAMA_CPP,
    LLAMA_THREADS,
    STREAM_LEVELS,
    STREAM_TOKENS,
    LlamaCppReport,
    SystemFigures,
)
from bench.markdown import markdown_table

NOT_STARTED = "not started"


def _load(values: tuple[float, float, float]) -> str:
    return ", ".join(f"{value:.2f}" for value in values)


def _runs(values: list[float]) -> str:
    """Every run's figure (the runs took turns with the other systems), or a dash when none was measured."""
    return ", ".join(f"{value:.1f}" for value in values) if values else "–"


def _ratio(exo: list[float], llama: list[float], *, lower_is_better: bool = False) -> str:
    if not exo or not llama:
        return "–"
    mine, theirs = statistics.mean(exo), statistics.mean(llama)
    if mine <= 0 or theirs <= 0:
        return "–"
    return f"{(theirs / mine if lower_is_better else mine / theirs):.2f}×"


def _memory(figure: SystemFigures) -> list[float]:
    return [figure.resident_bytes / 1e9] if figure.resident_bytes else []


def _largest(figure: SystemFigures) -> list[float]:
    return [figure.largest_resident_bytes / 1e9] if figure.largest_resident_bytes else []


def _tools(figure: SystemFigures, asked: int) -> str:
    return f"{figure.valid} valid, {figure.invalid} invalid, {figure.no_call} without a call (of {asked})"


def render_llama_cpp(report: LlamaCppReport) -> list[str]:
    figures = {figure.system: figure for figure in report.systems}
    names = list(figures)
    compared = [name for name in EXO_SYSTEMS if name in figures] if LLAMA_CPP in figures else []
    prompt_tokens = next((f.prompt_tokens for f in report.systems if f.prompt_tokens), None)
    measures: list[tuple[str, list[list[float]], bool]] = [
        (
            f"prefill, a {prompt_tokens or '~3,000'}-token prompt (tok/s)",
            [f.prefill_tokens_per_s for f in figures.values()],
            False,
        ),
        ("decode, one stream (tok/s)", [f.decode_tokens_per_s for f in figures.values()], False),
        *(
            (
                f"{level} stream{'s' if level > 1 else ''} at once, {STREAM_TOKENS} tokens each, prefill included "
                "(tok/s, all streams)",
                [f.streams_tokens_per_s.get(level, []) for f in figures.values()],
                False,
            )
            for level in STREAM_LEVELS
        ),
        ("resident memory of the server's processes (GB)", [_memory(f) for f in figures.values()], True),
        (
            "resident memory of its largest process: exo's runner, llama-server (GB)",
            [_largest(f) for f in figures.values()],
            True,
        ),
    ]
    absent = [name for name in report.not_started if name not in figures]
    header = ["Measure", *names, *absent, *(f"{name} ÷ llama.cpp" for name in compared)]
    rows: list[list[str]] = []
    for label, values, lower_is_better in measures:
        llama_runs = values[names.index(LLAMA_CPP)] if compared else []
        ratio = [_ratio(values[names.index(name)], llama_runs, lower_is_better=lower_is_better) for name in compared]
        rows.append([label, *(_runs(value) for value in values), *(NOT_STARTED for _ in absent), *ratio])
    rows.append(
        [
            f'valid tool calls, `tool_choice: "auto"`, the corpus\'s first {report.tool_prompts} prompts',
            *(_tools(figure, report.tool_prompts) for figure in figures.values()),
            *(NOT_STARTED for _ in absent),
            *([""] * len(compared)),
        ]
    )
    run = report.run
    size = f"{(report.gguf_bytes or 0) / 1e9:.2f} GB"
    gguf = f"GGUF `{report.gguf}` ({size})" if report.gguf is not None else "no GGUF found"
    flags = f" ({report.cpu_flags})" if report.cpu_flags else ""
    lines = [
        f"Run: commit {run.exo_commit}, {run.cpu}{flags}; load average (1, 5, 15 min) "
        f"{_load(report.load_at_start)} at the start, {_load(run.load_average)} at the end ({run.finished_utc}); "
        f"command `{run.command}`; "
        f"{report.rounds} round(s), the systems taking turns.",
        "",
        f"Model {report.model_id}; {gguf}"
        + "".join(f"; {figure.system} served {figure.served}" for figure in figures.values())
        + ".",
        "",
    ]
    lines += [line for name, why in report.not_started.items() for line in (f"**{name} not started**: {why}.", "")]
    if LLAMA_CPP in figures:
        lines += [
            f"llama-server ran with `--threads {LLAMA_THREADS} --ctx-size {LLAMA_CONTEXT} --parallel "
            f"{report.llama_slots} --jinja`.",
            "",
        ]
    if report.llama_server_settings and LLAMA_CPP in figures:
        lines += [f"llama-server's environment options: {', '.join(report.llama_server_settings)}.", ""]
    lines += markdown_table(header, rows)
    if compared:
        lines += [
            "÷ llama.cpp: the mean of that exo system's runs over the mean of llama.cpp's (for memory, llama.cpp's "
            "over exo's: below 1 means exo holds more).",
            "",
        ]
    return lines
