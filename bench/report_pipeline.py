"""Render section 8, one model over 1, 2 and 3 local nodes (pipeline parallel), as Markdown."""

from statistics import median

from bench.markdown import markdown_table
from bench.results import ConcurrentStreams, PipelineRow, PipelineSection

PIPELINE_TITLE = "## 8. Pipeline parallel over local nodes"
BATCH_TARGET = 1.8
"""A 2-node split's 4 streams over its own 1 stream (aggregate tok/s)."""


def hop_ms_per_token(row: PipelineRow, single: PipelineRow) -> float | None:
    """What each pipeline hop adds per token: (median ms/token at N nodes − at 1 node) / (N − 1)."""
    if row.nodes <= single.nodes:
        return None
    return (median(row.ms_per_token) - median(single.ms_per_token)) / (row.nodes - single.nodes)


def _row(row: PipelineRow, single: PipelineRow | None) -> list[str]:
    hop = hop_ms_per_token(row, single) if single is not None else None
    ms = median(row.ms_per_token)
    return [
        str(row.nodes),
        f"{ms:.1f}",
        f"{1000 / ms:.1f}",
        f"{median(row.ttft_s) * 1000:.0f}",
        "–" if hop is None else f"{hop:+.1f}",
        ", ".join(f"{value:.1f}" for value in row.ms_per_token),
    ]


def streams_speedup(row: PipelineRow, streams: int) -> float | None:
    """Aggregate tok/s at `streams` streams over one stream, on the same nodes."""
    by_count = {run.streams: run for run in row.concurrent}
    if streams not in by_count or 1 not in by_count:
        return None
    return by_count[streams].aggregate_tokens_per_s / by_count[1].aggregate_tokens_per_s


def _streams_cell(run: ConcurrentStreams | None) -> str:
    return "–" if run is None else f"{run.aggregate_tokens_per_s:.2f}"


def _concurrency_lines(section: PipelineSection) -> list[str]:
    rows = [row for row in section.rows if row.concurrent]
    if not rows:
        return []
    counts = sorted({run.streams for row in rows for run in row.concurrent})
    header = ["Nodes", *(f"{count} stream{'s' if count > 1 else ''}, tok/s" for count in counts), "4 streams ÷ 1"]
    table: list[list[str]] = []
    for row in rows:
        by_count = {run.streams: run for run in row.concurrent}
        speedup = streams_speedup(row, 4)
        table.append(
            [
                str(row.nodes),
                *(_streams_cell(by_count.get(count)) for count in counts),
                "–" if speedup is None else f"{speedup:.2f}×",
            ]
        )
    lines = [
        "",
        "Aggregate throughput: the same prompt as N greedy streamed requests sent at once, decoded together in the "
        "model's batch; tok/s = all streams' tokens / (first request sent → last stream finished), prefill and "
        "joining the batch included.",
        "",
        *markdown_table(header, table),
    ]
    split = next((row for row in rows if row.nodes == 2), None)
    speedup = streams_speedup(split, 4) if split is not None else None
    if speedup is not None:
        verdict = "met" if speedup >= BATCH_TARGET else "missed"
        lines += ["", f"Target: 2-node split, 4 streams ≥ {BATCH_TARGET}× its own 1 stream: {speedup:.2f}×, {verdict}."]
    return lines


def render_pipeline(section: PipelineSection) -> list[str]:
    """The section's Markdown lines."""
    single = next((row for row in section.rows if row.nodes == 1), None)
    load = ", ".join(f"{value:.2f}" for value in section.load_average)
    header = ["Nodes", "ms/token", "tok/s", "TTFT ms", "Per hop, ms/token", "ms/token per request"]
    return [
        PIPELINE_TITLE,
        "",
        f"Measured at commit {section.exo_commit}; load average (1, 5, 15 min) at the end {load}.",
        "",
        f"{section.model_id} split by layers over N exo nodes on 127.0.0.1 (separate processes, each with its own "
        "EXO_HOME, API and cluster port; the first holds the model and is started with `--min-nodes N`, the others "
        "with `--no-model --peer`, copying their layers' files from it). Fresh nodes per N, one untimed warm-up "
        f"request, then {section.requests} greedy streamed request(s) of up to {section.max_tokens} tokens on the "
        "same prompt, timed over HTTP. ms/token = (stream end − first text) / (tokens − 1), median; TTFT median; "
        "per hop = (ms/token at N − at 1) / (N − 1). All nodes share this machine's CPUs, so the figures include "
        "the ranks competing for cores, not only the hop.",
        "",
        *markdown_table(header, [_row(row, single) for row in section.rows]),
        *_concurrency_lines(section),
    ]
