"""Render section 8, one model over 1, 2 and 3 local nodes (pipeline parallel), as Markdown."""

from statistics import median

from bench.markdown import markdown_table
from bench.results import ConcurrentStreams, OverlapMeasurement, OverlapRun, PipelineRow, PipelineSection

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


def _run_at(row: PipelineRow, streams: int) -> ConcurrentStreams | None:
    return next((run for run in row.concurrent if run.streams == streams), None)


def _cpu_cells(run: ConcurrentStreams | None) -> list[str]:
    """Cores busy and CPU ms per token of a run (– where the run or its CPU time was not measured)."""
    if run is None or run.cpu_s is None or run.cores_busy is None:
        return ["–", "–"]
    return [f"{run.cores_busy:.2f}", f"{run.cpu_s * 1000 / run.completion_tokens:.0f}"]


def ms_per_step(run: ConcurrentStreams) -> float:
    """Wall time per `streams` tokens: one batch step of every stream, when they decode together."""
    return run.streams * 1000 / run.aggregate_tokens_per_s


SATURATED_SHARE = 0.85
"""Cores busy at or above this share of the machine's cores count as saturated."""


def missed_reason(section: PipelineSection, split: PipelineRow, streams: int) -> str:
    """Why the split's `streams` streams fell short, from what the run measured (or that it measured no reason)."""
    single = next((row for row in section.rows if row.nodes == 1), None)
    split_one, split_many = _run_at(split, 1), _run_at(split, streams)
    single_one = _run_at(single, 1) if single is not None else None
    single_many = _run_at(single, streams) if single is not None else None
    if split_one is None or split_many is None or single_one is None or single_many is None:
        return "no reason measured (the run has no one-node figures to compare with)."
    extra_one = ms_per_step(split_one) - ms_per_step(single_one)
    extra_many = ms_per_step(split_many) - ms_per_step(single_many)
    text = (
        f"at {streams} streams the split took {extra_many:.0f} ms more than one node per {streams} tokens (one step "
        f"of the batch), at 1 stream {extra_one:.0f} ms more per token"
    )
    cores = section.cpu_count
    if split_many.cores_busy is None or single_many.cores_busy is None or cores is None:
        return text + "; the run measured no CPU time, so no reason beyond that."
    text += (
        f"; meanwhile its nodes kept {split_many.cores_busy:.2f} of the machine's {cores} cores busy (one node "
        f"{single_many.cores_busy:.2f})"
    )
    if split_many.cores_busy >= SATURATED_SHARE * cores:
        return text + (
            ": the cores were saturated, so the split's extra time is CPU its ranks spent, not time they waited on "
            "each other; overlapping micro-batches fills waiting time and has none to fill here."
        )
    return text + (
        f": {cores - split_many.cores_busy:.2f} cores were left to other work (the load average counts it), time "
        "in which the ranks waited on each other."
    )


def _concurrency_lines(section: PipelineSection) -> list[str]:
    rows = [row for row in section.rows if row.concurrent]
    if not rows:
        return []
    single = next((row for row in section.rows if row.nodes == 1), None)
    counts = sorted({run.streams for row in rows for run in row.concurrent})
    header = [
        "Nodes",
        *(f"{count} stream{'s' if count > 1 else ''}, tok/s" for count in counts),
        "4 streams ÷ 1",
        "Per hop, ms/token",
        "Cores busy, 4 streams",
        "CPU ms/token, 4 streams",
        "Load (1 min) after",
    ]
    table: list[list[str]] = []
    for row in rows:
        by_count = {run.streams: run for run in row.concurrent}
        speedup = streams_speedup(row, 4)
        hop = hop_ms_per_token(row, single) if single is not None else None
        table.append(
            [
                str(row.nodes),
                *(_streams_cell(by_count.get(count)) for count in counts),
                "–" if speedup is None else f"{speedup:.2f}×",
                "–" if hop is None else f"{hop:+.1f}",
                *_cpu_cells(by_count.get(4)),
                "–" if row.load_average is None else f"{row.load_average[0]:.2f}",
            ]
        )
    lines = [
        "",
        "Aggregate throughput: the same prompt as N greedy streamed requests sent at once, decoded together in the "
        "model's batch; tok/s = all streams' tokens / (first request sent → last stream finished), prefill and "
        "joining the batch included. Per hop is the table above's (one request at a time). Cores busy = CPU time of "
        "every node and runner process during the 4-stream run / its wall time; CPU ms/token = that CPU time / the "
        "tokens generated.",
        "",
        *markdown_table(header, table),
    ]
    split = next((row for row in rows if row.nodes == 2), None)
    speedup = streams_speedup(split, 4) if split is not None else None
    if split is not None and speedup is not None:
        target = f"Target: 2-node split, 4 streams ≥ {BATCH_TARGET}× its own 1 stream: {speedup:.2f}×"
        if speedup >= BATCH_TARGET:
            lines += ["", f"{target}, met."]
        else:
            lines += ["", f"{target}, missed: {missed_reason(section, split, 4)}"]
    return lines


OVERLAP_GAIN = 1.05
"""Two micro-batches count as faster than one when they decode at least this much more (noise stays below it)."""


def overlap_gain(overlap: OverlapMeasurement, rows: int) -> float | None:
    """Two alternating micro-batches' tok/s over one micro-batch's, at `rows` rows, in a runner's environment."""
    by_split = {run.micro_batches: run for run in overlap.runs if run.rows == rows and run.threads_sleep}
    if 1 not in by_split or 2 not in by_split:
        return None
    return by_split[2].tokens_per_s / by_split[1].tokens_per_s


def sleep_gain(overlap: OverlapMeasurement, rows: int, micro_batches: int) -> float | None:
    """Idle threads sleeping over spinning: tok/s of the same configuration."""
    runs = [run for run in overlap.runs if (run.rows, run.micro_batches) == (rows, micro_batches)]
    sleeping = next((run for run in runs if run.threads_sleep), None)
    spinning = next((run for run in runs if not run.threads_sleep), None)
    if sleeping is None or spinning is None:
        return None
    return sleeping.tokens_per_s / spinning.tokens_per_s


def _overlap_lines(overlap: OverlapMeasurement) -> list[str]:
    def one_row(threads_sleep: bool) -> OverlapRun | None:
        return next(
            (run for run in overlap.runs if (run.rows, run.micro_batches, run.threads_sleep) == (1, 1, threads_sleep)),
            None,
        )

    table: list[list[str]] = []
    for run in overlap.runs:
        base = one_row(run.threads_sleep)
        table.append(
            [
                "sleep" if run.threads_sleep else "spin (default)",
                str(run.rows),
                str(run.micro_batches),
                f"{run.tokens_per_s:.2f}",
                "–" if base is None else f"{run.tokens_per_s / base.tokens_per_s:.2f}×",
            ]
        )
    load = ", ".join(f"{value:.2f}" for value in overlap.load_average)
    lines = [
        "",
        "Keeping the ring busy, measured on its own (`bench/pipeline_overlap.py`): the same model split over 2 rank "
        "processes (half the layers each, the runner's float32 weights and BLAS), greedy decode of N rows, forward "
        "passes only: as one micro-batch (the ranks take turns, as exo's pipeline batch does) or as two alternating "
        "micro-batches (rank 1 runs one while rank 0 finishes and samples the other). No all-gather ends a pass in "
        "either. Each configuration runs with the BLAS's idle threads sleeping at once (`KMP_BLOCKTIME=0`, what a "
        "pipeline rank's runner sets) and again spinning as they do by default. "
        f"{overlap.steps} timed steps per configuration after 4 untimed; load average (1, 5, 15 min) at its end "
        f"{load}.",
        "",
        *markdown_table(["Idle BLAS threads", "Rows", "Micro-batches", "tok/s", "÷ 1 row, same threads"], table),
    ]
    verdicts: list[str] = []
    for rows in sorted({run.rows for run in overlap.runs if run.micro_batches == 2}):
        gain = overlap_gain(overlap, rows)
        if gain is not None:
            verdict = "faster" if gain >= OVERLAP_GAIN else "not faster"
            verdicts.append(f"at {rows} rows two micro-batches decode {gain:.2f}× one ({verdict})")
    if verdicts:
        lines += ["", f"Overlapping, idle threads sleeping: {'; '.join(verdicts)}."]
    sleeping = [
        f"{gain:.2f}× at {rows} row{'s' if rows > 1 else ''}"
        for rows in sorted({run.rows for run in overlap.runs})
        if (gain := sleep_gain(overlap, rows, 1)) is not None
    ]
    if sleeping:
        lines += ["", f"Idle threads sleeping over spinning, one micro-batch: {', '.join(sleeping)}."]
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
        *(_overlap_lines(section.overlap) if section.overlap is not None else []),
    ]
