"""Markdown for the throughput sections: concurrent streams (4, with arrivals) and prompt-lookup speculation (7)."""

from bench.markdown import markdown_table
from bench.results import BenchReport, ConcurrencyRow, SpeculationReport
from bench.targets_throughput import batching_ceiling
from bench.workloads import EDIT_FILE_LINES

CONCURRENCY_TITLE = "## 4. Concurrent streams"
SPECULATION_TITLE = "## 7. Prompt-lookup speculation"


def _concurrency_rows(rows: list[ConcurrencyRow]) -> list[list[str]]:
    ordered = sorted(rows, key=lambda row: (row.streams, row.system != "exo"))
    single = {row.system: row.aggregate_tokens_per_s for row in rows if row.streams == 1}
    return [
        [
            str(row.streams),
            row.system,
            f"{row.aggregate_tokens_per_s:.2f}",
            ", ".join(f"{run:.2f}" for run in row.runs) or "–",
            f"{row.aggregate_tokens_per_s / single[row.system]:.2f}×" if row.system in single else "–",
            f"{row.per_stream_tokens_per_s:.2f}",
            f"{row.mean_ttft_s:.2f}",
        ]
        for row in ordered
    ]


def _step_columns(seconds: dict[int, float], sequences: int) -> list[str]:
    one, step = seconds.get(1), seconds.get(sequences)
    if not one or not step:
        return ["–", "–", "–"]
    return [f"{step * 1000:.1f}", f"{step / one:.2f}×", f"{batching_ceiling(seconds, sequences) or 0:.2f}×"]


def _batching_ceiling(seconds: dict[int, float], planned: dict[int, float]) -> list[str]:
    """What a decode step over N sequences costs on this machine, and so the most batching N streams can give."""
    if not seconds.get(1):
        return []
    rows = [
        [str(sequences), *_step_columns(seconds, sequences), *_step_columns(planned, sequences)]
        for sequences in sorted(seconds.keys() | planned.keys())
    ]
    header = ["Sequences", "Step ms", "× one sequence", "Most N streams can give"]
    return [
        "What batching can give here: one decode step (forward pass and greedy pick) over N sequences in bare "
        "mlx-lm, each sequence one token past the decode prompt, the same float32 weights and BLAS; best of the "
        "repeats, the sizes taking turns. N tokens per step over the step's cost is the most N batched streams can "
        "multiply one stream's decode throughput by, before prefill and serving work. The plan columns time the "
        "same steps through exo's matmul plan, which exo's runner uses: mlx-lm's own product `x @ Wᵀ` against the "
        "layout and padding measured fastest per weight shape (docs/OPERATIONS.md).",
        "",
        *markdown_table([*header, *(f"{column}, plan" for column in header[1:])], rows),
    ]


def render_concurrency(report: BenchReport) -> list[str]:
    settings = report.settings
    header = ["Streams", "System", "Aggregate tok/s", "Per repeat", "× one stream", "Per-stream tok/s", "Mean TTFT s"]
    lines = [
        CONCURRENCY_TITLE,
        "",
        f"N streams started at once (distinct prompts, greedy, max_tokens {settings.concurrency_max_tokens} each), "
        f"{settings.concurrency_repeats} repeat(s) per level; at every level exo and mlx_lm.server take turns, the "
        "order alternating, on the same float32 weights and BLAS. Aggregate = all tokens / time from the first "
        "request to the last token (mean of the repeats); per stream = each stream's tokens / its own wall time "
        "(waiting and prefill included), averaged; TTFT averaged over every stream.",
        "",
        *markdown_table(header, _concurrency_rows(report.concurrency)),
        "![concurrency](perf/concurrency.png)",
        "",
        *_batching_ceiling(report.batch_pass_seconds, report.planned_batch_pass_seconds),
    ]
    if report.arrival:
        rows = [
            [row.system, str(row.running_streams), f"{row.ttft_s:.2f}", f"{row.alone_ttft_s:.2f}"]
            for row in report.arrival
        ]
        lines += [
            f"A request arriving while {report.arrival[0].running_streams} others decode (each with max_tokens "
            f"{settings.arrival_max_tokens}, sent once all of them streamed their first token), against the same "
            "request shape with nothing else running:",
            "",
            *markdown_table(["System", "Streams decoding", "Arriving request's TTFT s", "Alone TTFT s"], rows),
        ]
    return lines


def _speculation_rows(section: SpeculationReport) -> list[list[str]]:
    off = {row.workload: row.median_tokens_per_s for row in section.rows if row.mode == "off"}
    rows: list[list[str]] = []
    for row in section.rows:
        baseline = off.get(row.workload)
        rows.append(
            [
                row.workload,
                row.mode,
                f"{row.median_tokens_per_s:.2f}",
                ", ".join(f"{speed:.2f}" for speed in row.tokens_per_s),
                f"{row.median_tokens_per_s / baseline:.3f}×" if baseline else "–",
                f"{row.accepted}/{row.drafted}" if row.drafted else "–",
                f"{row.completion_tokens * len(row.tokens_per_s) / row.forward_passes:.2f}"
                if row.forward_passes
                else "–",
                "yes" if row.same_tokens_as_off else "**no**",
            ]
        )
    return rows


def _workload_count(section: SpeculationReport) -> str:
    count = len({row.workload for row in section.rows})
    return {2: "Two", 3: "Three"}.get(count, str(count))


_SPECULATION_HEADER = [
    "Workload",
    "Mode",
    "Median tok/s",
    "Per run",
    "× off",
    "Drafts accepted",
    "Tokens per pass",
    "Same",
]


def _speculation_results(section: SpeculationReport) -> list[str]:
    """The table, the pass costs the default mode measured and how each workload's reply begins."""
    lines = markdown_table(_SPECULATION_HEADER, _speculation_rows(section))
    if section.pass_cost_ratios:
        costs = ", ".join(f"{fed}: {ratio:.2f}×" for fed, ratio in sorted(section.pass_cost_ratios.items()))
        lines.append(
            f"- Cost of a forward pass by tokens fed, relative to one token, as the default mode measured it: {costs}."
        )
    replies = {row.workload: row.text for row in section.rows if row.mode == "off"}
    return lines + [f"- {workload} reply begins: `{text[:160]!r}`" for workload, text in replies.items()]


def render_speculation_on_other_model(section: SpeculationReport) -> list[str]:
    """Section 7's table for another model, after the default model's."""
    load = ", ".join(f"{value:.2f}" for value in section.load_average)
    return [
        f"### The same workloads on {section.model_id}",
        "",
        f"Measured at commit {section.exo_commit} (`--only speculation --model {section.model_id}`); load average "
        f"(1, 5, 15 min) at the end {load}; {section.settings.repeats} run(s) per mode, as above.",
        "",
        *_speculation_results(section),
        "",
    ]


def render_speculation(section: SpeculationReport) -> list[str]:
    settings = section.settings
    load = ", ".join(f"{value:.2f}" for value in section.load_average)
    prompts = ", ".join(f"{workload} {tokens} prompt tokens" for workload, tokens in section.prompt_tokens.items())
    tools = "all" if settings.edit_tools is None else ", ".join(f"`{name}`" for name in settings.edit_tools)
    return [
        SPECULATION_TITLE,
        "",
        f"Measured at commit {section.exo_commit}; load average (1, 5, 15 min) at the end {load}.",
        "",
        f"{_workload_count(section)} workloads, greedy, max_tokens "
        f"{settings.max_tokens}, {settings.repeats} run(s) per mode with the modes taking turns: an opencode-shaped "
        f"edit (the agent read a {EDIT_FILE_LINES}-line Python file; the user asks for a change that `edit` must make "
        f"with the function's text as oldString; opencode's tool definitions offered: {tools}), a file rewrite (the "
        "same file read; the user asks for the whole updated file as text, no tools offered) and free text (the "
        f"decode section's essay prompt); {prompts}. Timed in-process around the runner's own scheduler and "
        "`ChatRequest` (a lone request, as the runner decodes it), sharing one prefix cache, so the prompt is "
        "prefilled once; tok/s = (tokens − 1) / (last token time − first token time). Modes: off; on as shipped (a "
        "draft is verified only where the measured cost of a multi-token pass says it pays); every draft verified. "
        "Tokens per pass = tokens / forward passes; Same = greedy output token for token the output with speculation "
        "off.",
        "",
        *_speculation_results(section),
        "",
        "![speculation](perf/speculation.png)",
        "",
    ]
