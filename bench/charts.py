"""PNG charts of a BenchReport (matplotlib, Agg backend: no display needed)."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: headless machines have no display

import matplotlib.pyplot as plt

from bench.results import BenchReport

CHART_NAMES = ("decode.png", "agent_turns.png", "parser_cost.png", "concurrency.png", "speculation.png")


def _decode_chart(report: BenchReport, path: Path) -> None:
    labels = [row.system.replace(" streaming, ", "\n") for row in report.decode]
    figure, (speed, ttft) = plt.subplots(1, 2, figsize=(11, 4.2))
    # An unmeasurable speed (the whole answer arrived at once) is drawn as an empty bar.
    speed.barh(labels, [row.decode_tokens_per_s or 0.0 for row in report.decode], color="#3b7dd8")
    speed.set_xlabel("decode tokens/s (higher is better)")
    ttft.barh(labels, [row.ttft_s for row in report.decode], color="#d8873b")
    ttft.set_xlabel("time to first token, s (lower is better)")
    ttft.set_yticklabels([])
    figure.suptitle(f"Decode speed and TTFT — {report.model_id}")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _agent_chart(report: BenchReport, path: Path) -> None:
    figure, axis = plt.subplots(figsize=(7, 4.2))
    width = 0.8 / max(len(report.agent), 1)
    for offset, series in enumerate(report.agent):
        positions = [turn.turn + (offset - (len(report.agent) - 1) / 2) * width for turn in series.turns]
        axis.bar(positions, [turn.ttft_s for turn in series.turns], width=width, label=series.system)
    axis.set_xticks([turn.turn for turn in report.agent[0].turns])
    axis.set_xlabel("agent turn")
    axis.set_ylabel("time to first token, s")
    axis.set_title("Agent session: TTFT per turn")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _parser_chart(report: BenchReport, path: Path) -> None:
    figure, axis = plt.subplots(figsize=(7, 4.2))
    sizes = [cost.argument_bytes / 1000 for cost in report.parser]
    axis.plot(sizes, [cost.microseconds_per_segment for cost in report.parser], marker="o")
    axis.set_xscale("log")
    axis.set_ylim(bottom=0)
    axis.set_xlabel("tool-call arguments, KB (log scale)")
    axis.set_ylabel("µs per ~4-character segment")
    axis.set_title("Tool-stream parser cost per segment")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _concurrency_chart(report: BenchReport, path: Path) -> None:
    figure, axis = plt.subplots(figsize=(7, 4.2))
    systems = list(dict.fromkeys(row.system for row in report.concurrency))
    for system in systems:
        rows = sorted((row for row in report.concurrency if row.system == system), key=lambda row: row.streams)
        streams = [row.streams for row in rows]
        axis.plot(streams, [row.aggregate_tokens_per_s for row in rows], marker="o", label=f"{system}: aggregate")
    levels = sorted({row.streams for row in report.concurrency})
    axis.set_xticks(levels)
    axis.set_ylim(bottom=0)
    axis.set_xlabel("streams started at once")
    axis.set_ylabel("aggregate tokens/s (higher is better)")
    axis.set_title("Throughput under concurrent streams")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _speculation_chart(report: BenchReport, path: Path) -> None:
    figure, axis = plt.subplots(figsize=(7, 4.2))
    section = report.speculation
    if section is not None:
        workloads = list(dict.fromkeys(row.workload for row in section.rows))
        modes = list(dict.fromkeys(row.mode for row in section.rows))
        width = 0.8 / max(len(modes), 1)
        for offset, mode in enumerate(modes):
            speeds = {row.workload: row.median_tokens_per_s for row in section.rows if row.mode == mode}
            positions = [index + (offset - (len(modes) - 1) / 2) * width for index in range(len(workloads))]
            axis.bar(positions, [speeds.get(workload, 0.0) for workload in workloads], width=width, label=mode)
        axis.set_xticks(range(len(workloads)), workloads)
        axis.legend(title="speculation")
    axis.set_ylabel("decode tokens/s, median (higher is better)")
    axis.set_title("Prompt-lookup speculation, a lone greedy request")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_charts(report: BenchReport, directory: Path) -> list[Path]:
    """Render every chart into `directory` (created if needed); returns the files in CHART_NAMES order."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / name for name in CHART_NAMES]
    _decode_chart(report, paths[0])
    _agent_chart(report, paths[1])
    _parser_chart(report, paths[2])
    _concurrency_chart(report, paths[3])
    _speculation_chart(report, paths[4])
    return paths
