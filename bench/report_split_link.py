"""Tensor against pipeline against one node over a slow link, as Markdown, from the JSON that
`tests.cluster.rig_hop_cost --parallel pipeline,tensor --json-out FILE` writes:
`uv run python -m bench.report_split_link FILE`.

The sentences are computed from the rows (which split was faster at which round trip, the round trips per token
each split paid, where they would break even), so they say what this run measured, not what an earlier one did.
"""

import argparse
import json
import re
import statistics
from pathlib import Path

from pydantic import BaseModel

from bench.markdown import markdown_table
from exo.master.split_choice import PIPELINE_ROUND_TRIPS_PER_TOKEN, tensor_round_trips_per_token

ROW_LABEL = re.compile(r"(?P<nodes>\d+) nodes, (?P<split>pipeline|tensor), \+(?P<rtt>[\d.]+) ms round trip")


class LinkRow(BaseModel):
    link: str
    load_average: float
    ms_per_token: list[float]
    median_ms_per_token: float
    ttft_ms: list[float]


class StreamsAtOnce(BaseModel):
    streams: int
    tokens: int
    seconds: float
    aggregate_tokens_per_s: float


class Prefill(BaseModel):
    prompt_tokens: list[int]
    ttft_s: list[float]
    median_prompt_tokens_per_s: float


class RankMemory(BaseModel):
    rank: int
    node: str
    planned_bytes: int
    # The weights the rank's runner reports holding as loaded (None: a run from before the bench read it).
    weights_bytes: int | None = None


class ExtrasRow(BaseModel):
    """Several streams at once, long prompts and planned memory, at no added delay (rig_split_extras.py)."""

    extras: str
    load_average: float
    memory: list[RankMemory]
    streams: StreamsAtOnce
    prefill: Prefill


class LinkRun(BaseModel):
    commit: str
    model: str
    machine: str
    keyed: bool
    max_tokens: int
    requests: int
    load_average_end: list[float]
    rows: list[LinkRow]
    extras: list[ExtrasRow] = []


class SplitFigures(BaseModel):
    """One split's median ms/token and time to first token at each added round trip (ms)."""

    ms_per_token: dict[float, float]
    # The fastest and slowest request of each row (ms/token).
    spread: dict[float, tuple[float, float]]
    ttft_ms: dict[float, float]
    load: dict[float, float]


def split_figures(run: LinkRun, split: str) -> SplitFigures:
    figures = SplitFigures(ms_per_token={}, spread={}, ttft_ms={}, load={})
    for row in run.rows:
        match = ROW_LABEL.fullmatch(row.link)
        if match is None or match["split"] != split:
            continue
        rtt = float(match["rtt"])
        figures.ms_per_token[rtt] = row.median_ms_per_token
        figures.spread[rtt] = (min(row.ms_per_token), max(row.ms_per_token))
        figures.ttft_ms[rtt] = statistics.median(row.ttft_ms)
        figures.load[rtt] = row.load_average
    return figures


def one_node(run: LinkRun) -> LinkRow:
    """The one-node rows pooled (one after each split): the same model on alpha alone."""
    rows = [row for row in run.rows if row.link.startswith("1 node")]
    pooled = [value for row in rows for value in row.ms_per_token]
    return LinkRow(
        link="one node",
        load_average=max(row.load_average for row in rows),
        ms_per_token=pooled,
        median_ms_per_token=statistics.median(pooled),
        ttft_ms=[value for row in rows for value in row.ttft_ms],
    )


def round_trips_per_token(figures: SplitFigures) -> float | None:
    """How many added round trips each token waited for: the slope of ms/token over the added round trip between
    the smallest and the largest delay above zero (any delay puts the switch's delaying thread, and its wake-ups, on
    the path, so +0 is not on the same line); None with fewer than two such delays."""
    delayed = sorted(rtt for rtt in figures.ms_per_token if rtt > 0)
    if len(delayed) < 2:
        return None
    low, high = delayed[0], delayed[-1]
    return (figures.ms_per_token[high] - figures.ms_per_token[low]) / (high - low)


def report(run: LinkRun, command: str, layers: int | None = None) -> list[str]:
    pipeline, tensor, single = split_figures(run, "pipeline"), split_figures(run, "tensor"), one_node(run)
    trips = sorted(pipeline.ms_per_token)
    lines = [
        f"Run at commit {run.commit} on {run.machine}, model `{run.model}`, "
        f"{'keyed (TLS relays)' if run.keyed else 'no cluster key'}, {run.requests} greedy streamed requests of "
        f"{run.max_tokens} tokens per row after one warm-up, rank 0's node asked; `{command}`. Load average (1 min) "
        f"beside each row; {run.load_average_end[0]:.1f} {run.load_average_end[1]:.1f} "
        f"{run.load_average_end[2]:.1f} at the end. The figures are loaded: both nodes share the machine's cores "
        "with other engineers' work.",
        "",
    ]
    header = ["added round trip", "pipeline tok/s", "tensor tok/s", "one node tok/s"]
    header += ["pipeline TTFT ms", "tensor TTFT ms", "one node TTFT ms", "load"]
    rows: list[list[str]] = []
    for rtt in trips:
        rows.append(
            [
                f"+{rtt:g} ms",
                f"{1000 / pipeline.ms_per_token[rtt]:.1f} ({pipeline.ms_per_token[rtt]:.1f} ms)",
                f"{1000 / tensor.ms_per_token[rtt]:.1f} ({tensor.ms_per_token[rtt]:.1f} ms)",
                f"{1000 / single.median_ms_per_token:.1f} ({single.median_ms_per_token:.1f} ms)"
                if rtt == trips[0]
                else "",
                f"{pipeline.ttft_ms[rtt]:.0f}",
                f"{tensor.ttft_ms[rtt]:.0f}",
                f"{statistics.median(single.ttft_ms):.0f}" if rtt == trips[0] else "",
                f"{pipeline.load[rtt]:.1f} / {tensor.load[rtt]:.1f}",
            ]
        )
    lines += markdown_table(header, rows)
    lines.append(
        "Decode tok/s = 1000 / the median of (stream end − first text) / (tokens − 1); TTFT is the median time to "
        "the first streamed text. The one-node column pools the model placed on alpha alone after each split "
        f"(no link; {len(single.ms_per_token)} requests, {min(single.ms_per_token):.1f}–"
        f"{max(single.ms_per_token):.1f} ms/token). Load: the 1-minute average after the pipeline / tensor row."
    )
    lines.append("")
    lines += [f"- {sentence}" for sentence in findings(pipeline, tensor, single)]
    if run.extras:
        lines += ["", *extras_table(run.extras)]
    if layers is not None:
        lines.append(f"- {per_exchange(pipeline, tensor, single, layers)}")
    return [*lines, ""]


def extras_table(extras: list[ExtrasRow]) -> list[str]:
    streams = extras[0].streams.streams
    header = ["at +0 ms", f"{streams} streams at once, tok/s", "prompt tok/s (long prompt)", "prompt tokens"]
    header += ["planned memory per rank (MiB)", "weights held per rank", "load"]
    rows = [
        [
            row.extras,
            f"{row.streams.aggregate_tokens_per_s:.1f} ({row.streams.tokens} tokens in {row.streams.seconds:.1f} s)",
            f"{row.prefill.median_prompt_tokens_per_s:.0f}",
            f"{statistics.median(row.prefill.prompt_tokens):.0f}",
            ", ".join(f"{rank.planned_bytes / 2**20:.0f}" for rank in row.memory),
            ", ".join(_held(rank.weights_bytes) for rank in row.memory),
            f"{row.load_average:.1f}",
        ]
        for row in extras
    ]
    lines = markdown_table(header, rows)
    lines.append(
        "Prompt tok/s = prompt tokens / time to first token (which includes one decode step), median of the "
        "requests; each prompt new to every cache. Planned memory is what placement reserved for each rank (its "
        "weights in float32 plus room to serve); weights held is what each rank's runner reports its loaded weights "
        "take (the bytes of every array of the model it holds, int8 scales included), not the process's resident "
        "size (n/a: a run from before the bench read it)."
    )
    split_rows = [row for row in extras if not row.extras.startswith("1 node")]
    if len(split_rows) >= 2:
        best = max(split_rows, key=lambda row: row.streams.aggregate_tokens_per_s)
        fastest_prefill = max(split_rows, key=lambda row: row.prefill.median_prompt_tokens_per_s)
        lines += [
            "",
            f"- Of the splits, {best.extras} served {streams} streams fastest "
            f"({best.streams.aggregate_tokens_per_s:.1f} tok/s) and {fastest_prefill.extras} read long prompts "
            f"fastest ({fastest_prefill.prefill.median_prompt_tokens_per_s:.0f} tok/s).",
        ]
    return [*lines, ""]


def _held(count: int | None) -> str:
    if count is None:
        return "n/a"
    return f"{count / 2**20:.1f} MiB" if count >= 2**20 else f"{count / 2**10:.0f} KiB"


def findings(pipeline: SplitFigures, tensor: SplitFigures, single: LinkRow) -> list[str]:
    sentences: list[str] = []
    for rtt in sorted(pipeline.ms_per_token):
        ratio = pipeline.ms_per_token[rtt] / tensor.ms_per_token[rtt]
        faster = "tensor" if ratio > 1 else "pipeline"
        low, high = tensor.spread[rtt]
        sentences.append(
            f"At +{rtt:g} ms the {faster} split was faster: tensor decoded at {ratio:.2f}× the pipeline's rate "
            f"({tensor.ms_per_token[rtt]:.1f} against {pipeline.ms_per_token[rtt]:.1f} ms/token; tensor's requests "
            f"{low:.1f}–{high:.1f})."
        )
    delayed = sorted(rtt for rtt in pipeline.ms_per_token if rtt > 0)
    span = f"from +{delayed[0]:g} to +{delayed[-1]:g} ms" if len(delayed) >= 2 else "between the delays"
    for name, figures in (("pipeline", pipeline), ("tensor split", tensor)):
        slope = round_trips_per_token(figures)
        if slope is None:
            continue
        sentences.append(
            f"{span.capitalize()}, each added millisecond of round trip cost the {name} {slope:.1f} ms/token"
            + (
                f" (about {slope:.0f} round trip{'' if round(slope) == 1 else 's'} per token)."
                if slope > 0.5
                else ": not resolved, the requests' spread is larger than what the delay adds."
            )
        )
    tensor_lead = pipeline.ms_per_token[0.0] - tensor.ms_per_token[0.0] if 0.0 in pipeline.ms_per_token else None
    if tensor_lead is not None:
        sentences.append(
            "With nothing added on the link tensor was "
            + (
                f"{tensor_lead:.1f} ms/token faster than the pipeline."
                if tensor_lead > 0
                else f"{-tensor_lead:.1f} ms/token slower than the pipeline, so no round trip favours it here."
            )
        )
    best_split = min(*pipeline.ms_per_token.values(), *tensor.ms_per_token.values())
    sentences.append(
        f"One node ({single.median_ms_per_token:.1f} ms/token) was "
        + (
            f"faster than either split at its best ({best_split:.1f} ms/token)."
            if single.median_ms_per_token < best_split
            else f"slower than the best split ({best_split:.1f} ms/token)."
        )
    )
    return sentences


def per_exchange(pipeline: SplitFigures, tensor: SplitFigures, single: LinkRow, layers: int) -> str:
    """What one exchange over the link cost at +0, if each token waits for 2L+1 of them split by matrices and 3
    split by layers (master/split_choice.py), beyond one node's time per token."""
    tensor_trips = tensor_round_trips_per_token(layers)
    tensor_cost = (tensor.ms_per_token[0.0] - single.median_ms_per_token) / tensor_trips
    pipeline_cost = (pipeline.ms_per_token[0.0] - single.median_ms_per_token) / PIPELINE_ROUND_TRIPS_PER_TOKEN
    return (
        f"Read as {tensor_trips} exchanges per token split by matrices ({layers} layers) and "
        f"{PIPELINE_ROUND_TRIPS_PER_TOKEN} by layers, beyond one node's time per token, one exchange through the "
        f"link with nothing added cost {tensor_cost:.1f} ms in the tensor rows and {pipeline_cost:.1f} ms in the "
        "pipeline rows: the switch and the scheduling of the ranks on the loaded cores, not the wire."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", help="the JSON file rig_hop_cost --json-out wrote")
    parser.add_argument(
        "--command",
        default="uv run python -m tests.cluster.rig_hop_cost --nodes 2 --parallel pipeline,tensor "
        "--round-trips-ms 0,1,5 --rates '' --requests 5 --json-out docs/perf/split_link.json",
    )
    parser.add_argument("--layers", type=int, help="the model's layer count (adds what one exchange cost)")
    arguments = parser.parse_args()
    run = LinkRun.model_validate(json.loads(Path(arguments.results).read_text()))
    print("\n".join(report(run, arguments.command, arguments.layers)))


if __name__ == "__main__":
    main()
