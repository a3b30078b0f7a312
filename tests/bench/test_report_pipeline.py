"""Section 8 renders one row per node count with medians and the per-hop cost against one node."""

from bench.report_pipeline import PIPELINE_TITLE, render_pipeline
from bench.results import ConcurrentStreams, PipelineRow, PipelineSection


def test_rows_medians_and_hop_cost() -> None:
    section = PipelineSection(
        rows=[
            PipelineRow(nodes=1, ttft_s=[0.30, 0.20, 0.25], ms_per_token=[50.0, 40.0, 45.0], completion_tokens=48),
            PipelineRow(nodes=2, ttft_s=[0.40, 0.35, 0.50], ms_per_token=[55.0, 60.0, 52.0], completion_tokens=48),
            PipelineRow(nodes=3, ttft_s=[0.60, 0.55, 0.70], ms_per_token=[70.0, 65.0, 66.0], completion_tokens=48),
        ],
        model_id="test-model",
        max_tokens=48,
        requests=3,
        load_average=(2.0, 1.5, 1.0),
        exo_commit="abc1234",
    )

    text = "\n".join(render_pipeline(section))

    assert text.startswith(PIPELINE_TITLE)
    assert "load average (1, 5, 15 min) at the end 2.00, 1.50, 1.00" in text
    assert "| 1 | 45.0 | 22.2 | 250 | – | 50.0, 40.0, 45.0 |" in text
    assert "| 2 | 55.0 | 18.2 | 400 | +10.0 | 55.0, 60.0, 52.0 |" in text
    assert "| 3 | 66.0 | 15.2 | 600 | +10.5 | 70.0, 65.0, 66.0 |" in text


def test_aggregate_throughput_by_streams_and_the_batching_target() -> None:
    def row(nodes: int, tokens_per_s: dict[int, float]) -> PipelineRow:
        return PipelineRow(
            nodes=nodes,
            ttft_s=[0.3],
            ms_per_token=[50.0],
            completion_tokens=48,
            concurrent=[
                ConcurrentStreams(streams=streams, completion_tokens=48 * streams, wall_s=48 * streams / rate)
                for streams, rate in tokens_per_s.items()
            ],
        )

    section = PipelineSection(
        rows=[row(1, {1: 5.0, 2: 8.0, 4: 11.0, 8: 12.0}), row(2, {1: 4.0, 2: 6.0, 4: 7.0, 8: 8.0})],
        model_id="test-model",
        max_tokens=48,
        requests=1,
        load_average=(2.0, 1.5, 1.0),
        exo_commit="abc1234",
    )

    text = "\n".join(render_pipeline(section))

    assert (
        "| Nodes | 1 stream, tok/s | 2 streams, tok/s | 4 streams, tok/s | 8 streams, tok/s | 4 streams ÷ 1 |" in text
    )
    assert "| 1 | 5.00 | 8.00 | 11.00 | 12.00 | 2.20× |" in text
    assert "| 2 | 4.00 | 6.00 | 7.00 | 8.00 | 1.75× |" in text
    assert "Target: 2-node split, 4 streams ≥ 1.8× its own 1 stream: 1.75×, missed." in text
