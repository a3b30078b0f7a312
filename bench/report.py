"""Render a BenchReport as Markdown: machine, targets, one table per section, charts and method."""

from datetime import UTC, datetime

from bench.markdown import markdown_table, without_directories
from bench.report_agent_sessions import render_agent_sessions
from bench.report_blas import render_blas
from bench.report_constrained import CONSTRAINED_TITLE, render_constrained
from bench.report_pipeline import render_pipeline
from bench.report_throughput import (
    CONCURRENCY_TITLE,
    SPECULATION_TITLE,
    render_concurrency,
    render_speculation,
    render_speculation_on_other_model,
)
from bench.results import RAW_REPLACED, AgentSeries, BenchReport, SectionKey
from bench.targets import (
    EXO_NO_TOOLS,
    EXO_TOOLS,
    MLX_LM_NO_TOOLS,
    MLX_LM_TOOLS,
    RAW,
    TargetCheck,
    baseline_row,
    check_targets,
    find_row,
    format_ratio,
    format_speed,
    paired_decode_ratio,
    ratio,
)

SECTION_TITLES = (
    "## 1. Decode speed and time to first token",
    "## 2. Agent turns",
    "## 3. Tool-stream parser cost",
    CONCURRENCY_TITLE,
    CONSTRAINED_TITLE,
    SPECULATION_TITLE,
)
BUSY_LOAD_PER_CPU = 1.0
"""A 1-minute load average above this many runnable processes per CPU means other work competed with the benchmark
(the bench's own runs keep every CPU busy, so up to one per CPU is the bench itself)."""


def _machine(report: BenchReport) -> list[str]:
    machine = report.machine
    load = ", ".join(f"{value:.2f}" for value in machine.load_average)
    rows = [
        ["Platform", machine.platform],
        ["Python", machine.python],
        ["CPUs", f"{machine.cpu_count} × {machine.cpu_model}"],
        ["Load average (1, 5, 15 min) at the end", load],
        ["mlx / mlx-lm", f"{machine.mlx_version} / {machine.mlx_lm_version}"],
        ["BLAS", without_directories(machine.blas)],
        ["float32 512×512 matmul with that BLAS", f"{machine.matmul_gflops:.0f} GFLOP/s"],
        ["exo commit (as the run started)", machine.exo_commit],
        ["Model", _model(report)],
        ["Run", _run_description(report)],
    ]
    lines = ["## Machine", "", *markdown_table(["", ""], rows)]
    if machine.load_average[0] > BUSY_LOAD_PER_CPU * machine.cpu_count:
        lines += [
            "**Taken with other work on the machine** (see the load average): absolute numbers are lower and "
            "noisier than on a quiet machine; ratios between systems, measured in alternation, are more reliable.",
            "",
        ]
    return lines


def _model(report: BenchReport) -> str:
    """The model's id, and the folder's name where it differs (never the machine's path to it)."""
    folder = without_directories(report.model_path)
    return report.model_id if folder == report.model_id else f"{report.model_id} (folder `{folder}`)"


def _run_description(report: BenchReport) -> str:
    kind = "quick smoke run" if report.settings.quick else "full run"
    if report.servers_measured_apart:
        return (
            f"sections 1, 2 and 4 in one `--only servers` {kind} ({report.wall_s:.0f} s); "
            "the other sections as their own lines say"
        )
    return f"{kind}, {report.wall_s:.0f} s in all"


def _targets(checks: list[TargetCheck]) -> list[str]:
    rows = [[check.target, check.measured, check.verdict, check.why] for check in checks]
    met = sum(check.met and check.settled for check in checks)
    unsettled = sum(not check.settled for check in checks)
    return [
        "## Targets",
        "",
        f"{met} of {len(checks)} targets met"
        + (f", {unsettled} not settled by this run's paired rounds." if unsettled else "."),
        "",
        *markdown_table(["Target", "Measured", "", "Why"], rows),
    ]


def _decode(report: BenchReport) -> list[str]:
    raw = baseline_row(report.decode)
    rows = [
        [
            row.system,
            format_speed(row.decode_tokens_per_s),
            format_ratio(ratio(row.decode_tokens_per_s, raw.decode_tokens_per_s)),
            f"{row.ttft_s:.2f}",
            str(row.prompt_tokens),
            str(row.completion_tokens),
        ]
        for row in report.decode
    ]
    exo_plain, exo_tools = find_row(report.decode, EXO_NO_TOOLS), find_row(report.decode, EXO_TOOLS)
    peer_tools = find_row(report.decode, MLX_LM_TOOLS)
    peer_plain = find_row(report.decode, MLX_LM_NO_TOOLS)
    settings = report.settings
    return [
        SECTION_TITLES[0],
        "",
        f"Greedy (temperature 0), max_tokens {settings.decode_max_tokens}, a long free-text answer; best decode "
        f"speed of {settings.decode_repeats} run(s) per system (rounds of every system in turn), TTFT of the first "
        "run (a prompt no cache had seen). Decode tokens/s = (completion tokens − 1) / (last token time − first "
        "token time). exo runs as shipped: continuous batching, prompt-lookup speculation and the matmul plan on. "
        f"× raw is against {raw.system}"
        + (
            "; this run had no stock mlx-lm baseline (it was measured before the bench had one)."
            if raw.system != RAW
            else " (the float32 weights exo serves, loaded with `mlx_lm.load` in a process that never imported "
            "exo's engine)."
        ),
        "",
        *markdown_table(["System", "Decode tok/s", "× raw", "TTFT s", "Prompt tokens", "Completion tokens"], rows),
        f"- exo / raw: **{format_ratio(ratio(exo_plain.decode_tokens_per_s, raw.decode_tokens_per_s))}** without "
        f"tools, {format_ratio(ratio(exo_tools.decode_tokens_per_s, raw.decode_tokens_per_s))} with tools (a longer "
        "prompt), best runs.",
        *_paired_line(report),
        f"- exo / mlx_lm.server: **{format_ratio(ratio(exo_plain.decode_tokens_per_s, peer_plain.decode_tokens_per_s))}"
        f"** without tools, **{format_ratio(ratio(exo_tools.decode_tokens_per_s, peer_tools.decode_tokens_per_s))}** "
        "with tools, best runs.",
        *_paired_peer_lines(report),
        "",
        "![decode speed and TTFT](perf/decode.png)",
        "",
    ]


def _paired_line(report: BenchReport) -> list[str]:
    interval = paired_decode_ratio(report.decode, EXO_NO_TOOLS, baseline_row(report.decode).system)
    if interval is None:
        return []
    return [
        f"- exo / raw without tools, round by round (each round ran both back to back): {interval.describe()}; the "
        "interval is Student's t over the per-round ratios.",
    ]


def _paired_peer_lines(report: BenchReport) -> list[str]:
    """exo over mlx_lm.server round by round, with and without tools (the best runs can come from different rounds)."""
    lines: list[str] = []
    for exo, peer, label in ((EXO_NO_TOOLS, MLX_LM_NO_TOOLS, "without tools"), (EXO_TOOLS, MLX_LM_TOOLS, "with tools")):
        try:
            interval = paired_decode_ratio(report.decode, exo, peer)
        except KeyError:
            continue
        if interval is not None:
            lines.append(f"- exo / mlx_lm.server {label}, round by round: {interval.describe()}.")
    return lines


def _agent(report: BenchReport) -> list[str]:
    exo = next(series for series in report.agent if series.system == "exo")
    others = [series for series in report.agent if series.system != "exo"]
    header = ["Turn", "exo prompt tokens", "exo cached tokens", "exo TTFT s", "exo × turn 1"]
    for series in others:
        header += [f"{series.system} cached tokens", f"{series.system} TTFT s", f"{series.system} × turn 1"]
    rows: list[list[str]] = []
    for index, turn in enumerate(exo.turns):
        row = [str(turn.turn), str(turn.prompt_tokens), str(turn.cached_tokens), f"{turn.ttft_s:.2f}"]
        row.append(format_ratio(ratio(turn.ttft_s, exo.turns[0].ttft_s)))
        for series in others:
            other = series.turns[index]
            first = series.turns[0].ttft_s
            row += [str(other.cached_tokens), f"{other.ttft_s:.2f}", format_ratio(ratio(other.ttft_s, first))]
        rows.append(row)
    settings = report.settings
    return [
        SECTION_TITLES[1],
        "",
        f"An opencode-shaped session: a {settings.agent_system_chars:,}-character system prompt and "
        f"{settings.agent_tool_count} tool schemas, {settings.agent_turns} turns; each turn resends the whole "
        "conversation plus the previous reply and a new user message (or, after a tool call, its tool result). "
        f"max_tokens {settings.agent_max_tokens}. Cached tokens are each server's "
        "`usage.prompt_tokens_details.cached_tokens`.",
        "",
        *markdown_table(header, rows),
        *_agent_summary(exo, others),
        "![agent turn TTFT](perf/agent_turns.png)",
        "",
    ]


def _agent_summary(exo: AgentSeries, others: list[AgentSeries]) -> list[str]:
    lines: list[str] = []
    for series in [exo, *others]:
        later = sum(turn.ttft_s for turn in series.turns[1:]) / max(len(series.turns) - 1, 1)
        lines.append(f"- {series.system}: turn 1 {series.turns[0].ttft_s:.2f} s, later turns {later:.2f} s on average.")
    return [*lines, ""]


def _parser(report: BenchReport) -> list[str]:
    rows = [
        [
            f"{cost.argument_bytes:,}",
            str(cost.segments),
            f"{cost.microseconds_per_segment:.2f}",
            f"{cost.chars_examined_per_char:.2f}",
        ]
        for cost in report.parser
    ]
    settings = report.settings
    return [
        SECTION_TITLES[2],
        "",
        f"A Hermes `<tool_call>` whose arguments JSON has the given size, fed to `ToolStreamParser` in "
        f"{settings.parser_segment_chars}-character segments (about one token each), then `finish()`; best of "
        f"{settings.parser_repeats} run(s), sizes taking turns. Characters examined per character fed is the "
        "count of the characters its scanners look at (bench/parser_work.py, in a run of its own): a count, not a "
        "time, so other work on the CPU cannot disturb it.",
        "",
        *markdown_table(["Arguments, bytes", "Segments", "µs per segment", "Characters examined per character"], rows),
        "![parser cost](perf/parser_cost.png)",
        "",
    ]


def _method(report: BenchReport) -> list[str]:
    """How the numbers were taken, from what this report holds: one run or several, which baselines ran."""
    commands = {without_directories(run.command) for run in report.runs.values()}
    if len(commands) == 1 and len(report.runs) >= 4:
        invocation = f"One invocation (`{commands.pop()}`) measured every section"
    else:
        invocation = "The sections come from separate runs, each named at its section"
    systems = {row.system for row in report.decode}
    raw_lines = (
        [
            f"- {RAW}: `mlx_lm.stream_generate` in a long-lived subprocess that loads the float32 weights exo serves "
            "with `mlx_lm.load` and never imports exo's engine (the bench refuses it otherwise), with the BLAS preload "
            "exo's runner gets.",
        ]
        if RAW in systems
        else []
    )
    raw_lines += (
        [
            f"- {RAW_REPLACED}: the same loop on the model as exo's own `load_model` leaves it (float32, exo's numpy "
            "kernels re-pointed into mlx-lm), in a subprocess started with exo's runner environment "
            "(`blas_environment`). It also writes the float32 copy the others load.",
        ]
        if RAW_REPLACED in systems
        else []
    )
    return [
        "## Method",
        "",
        f"- {invocation}. Within a run the compared systems stay loaded side by side and take turns run by run, "
        "never running at the same time, so changing load from other processes falls on all of them alike.",
        "- exo runs as a real subprocess (`python -m exo --api-port P --model DIR --models-dir TMP`) with "
        "`--cpu-kernels auto`: on a Linux CPU its runner loads the weights as float32 with the optimized BLAS "
        "preloaded and its CPU replacements on.",
        *raw_lines,
        "- mlx_lm.server (`python -m mlx_lm server --model DIR --port P`) runs with the same BLAS preload and is given "
        "the float32 copy of the same weights: on the float16 checkpoint it would skip BLAS on x86 and be many times "
        "slower, which would measure dtype rather than the server.",
        "- Every server gets a short warm-up request first. Each decode run uses a distinct prompt so no prompt cache "
        "answers it. Token counts come from `usage` (`stream_options.include_usage`).",
    ]


_OWN_COMMIT_LINE: frozenset[SectionKey] = frozenset(
    {"constrained", "blas", "speculation", "pipeline", "agent-sessions"}
)
"""Sections whose own results carry the commit and load of their run (printed by their renderers)."""


def _run_line(report: BenchReport, key: SectionKey) -> list[str]:
    """Where and how a section was measured, as recorded, or that it was not."""
    run = report.runs.get(key)
    if run is None and key in _OWN_COMMIT_LINE:
        return [
            "The machine and command of this section's run were not recorded (it was measured before the bench "
            "recorded them per section); its commit and load follow.",
            "",
        ]
    if run is None:
        return [
            "Commit, machine, load and command of this section's run were not recorded (it was measured before the "
            "bench recorded them per section).",
            "",
        ]
    load = ", ".join(f"{value:.2f}" for value in run.load_average)
    return [
        f"Run: commit {run.exo_commit}, {run.cpu}, load average (1, 5, 15 min) {load} at its end "
        f"({run.finished_utc}), command `{without_directories(run.command)}`.",
        "",
    ]


def _placed(section: list[str], run: list[str]) -> list[str]:
    """`run` under the section's title (the first two lines: the title and a blank line)."""
    return [*section[:2], *run, *section[2:]] if section else []


def _sizes(report: BenchReport) -> list[str]:
    settings = report.settings
    if settings.quick:
        return ["- This is a `--quick` smoke run on a tiny fixture model: the numbers only prove the suite works."]
    return [
        f"- Token counts are kept small (decode max_tokens {settings.decode_max_tokens}, agent turns "
        f"{settings.agent_max_tokens}, concurrent streams {settings.concurrency_max_tokens}) so a full run stays "
        "within an hour or two on 2 shared CPU cores; longer generations would give steadier decode figures.",
        "- exo's runner refines and checks its matmul plan while idle in its first minutes (at most a quarter of "
        "its idle time, stopping whenever a request comes, product timings capped at 20 s of measuring; before "
        "these bounds about 4.5 minutes at up to 200% CPU on 2 cores): the first exo measurements after a start "
        "can share the cores with it (docs/OPERATIONS.md, the matmul plan).",
    ]


def render_markdown(report: BenchReport, notes: list[str]) -> str:
    """The whole PERFORMANCE.md text; chart links point at `perf/` next to the Markdown file."""
    today = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# exo performance",
        "",
        f"Generated by `uv run python -m bench` on {today}. Model: **{report.model_id}**.",
        "",
        *_machine(report),
        *_targets(check_targets(report)),
        *_placed(_decode(report), _run_line(report, "servers")),
        *_placed(_agent(report), _run_line(report, "servers")),
        *_placed(_parser(report), _run_line(report, "parser")),
        *_placed(render_concurrency(report), _run_line(report, "servers")),
        *_placed(
            render_constrained(report.constrained) if report.constrained else [], _run_line(report, "constrained")
        ),
        *_placed(render_blas(report.blas) if report.blas is not None else [], _run_line(report, "blas")),
        *_placed(
            render_speculation(report.speculation) if report.speculation is not None else [],
            _run_line(report, "speculation"),
        ),
        *(line for other in report.speculation_other_models for line in render_speculation_on_other_model(other)),
        *_placed(
            render_pipeline(report.pipeline) if report.pipeline is not None else [], _run_line(report, "pipeline")
        ),
        *_placed(
            render_agent_sessions(report.agent_sessions) if report.agent_sessions is not None else [],
            _run_line(report, "agent-sessions"),
        ),
        *_method(report),
        *_sizes(report),
    ]
    if notes:
        lines += ["", "## Notes", "", *(f"- {note}" for note in notes)]
    return "\n".join(lines) + "\n"
