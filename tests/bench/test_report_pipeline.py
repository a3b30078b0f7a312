"""Section 8 renders one row per node count with medians and the per-hop cost against one node."""

from bench.report_pipeline import PIPELINE_TITLE, render_pipeline
from bench.results import ConcurrentStreams, OverlapMeasurement, OverlapRun, PipelineRow, PipelineSection


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
        "| Nodes | 1 stream, tok/s | 2 streams, tok/s | 4 streams, tok/s | 8 streams, tok/s | 4 streams ÷ 1 "
        "| Per hop, ms/token | Cores busy, 4 streams | CPU ms/token, 4 streams | Load (1 min) after |" in text
    )
    assert "| 1 | 5.00 | 8.00 | 11.00 | 12.00 | 2.20× | – | – | – | – |" in text
    assert "| 2 | 4.00 | 6.00 | 7.00 | 8.00 | 1.75× | +0.0 | – | – | – |" in text
    # 1 stream: 250 ms/token on the split, 200 on one node; 4 streams: 571 ms per 4 tokens against 364.
    assert (
        "Target: 2-node split, 4 streams ≥ 1.8× its own 1 stream: 1.75×, missed: at 4 streams the split took 208 ms "
        "more than one node per 4 tokens (one step of the batch), at 1 stream 50 ms more per token; the run measured "
        "no CPU time, so no reason beyond that." in text
    )


def _section_with_cpu(split_cores: float, *, split_rate_4: float) -> PipelineSection:
    """One node and a 2-node split, 1 and 4 streams of 48 tokens, each 4-stream run with its CPU time."""

    def run(streams: int, rate: float, cores: float) -> ConcurrentStreams:
        wall = 48 * streams / rate
        return ConcurrentStreams(streams=streams, completion_tokens=48 * streams, wall_s=wall, cpu_s=cores * wall)

    def row(nodes: int, rate_1: float, rate_4: float, cores: float) -> PipelineRow:
        return PipelineRow(
            nodes=nodes,
            ttft_s=[0.3],
            ms_per_token=[50.0 * nodes],
            completion_tokens=48,
            concurrent=[run(1, rate_1, 1.0), run(4, rate_4, cores)],
            load_average=(3.0, 2.0, 1.0),
        )

    return PipelineSection(
        rows=[row(1, 10.0, 20.0, 1.9), row(2, 8.0, split_rate_4, split_cores)],
        model_id="test-model",
        max_tokens=48,
        requests=1,
        load_average=(3.0, 2.0, 1.0),
        exo_commit="abc1234",
        cpu_count=2,
    )


def test_a_missed_target_with_saturated_cores_says_overlap_has_nothing_to_fill() -> None:
    text = "\n".join(render_pipeline(_section_with_cpu(1.8, split_rate_4=12.0)))

    assert "| 2 | 8.00 | 12.00 | 1.50× | +50.0 | 1.80 | 150 | 3.00 |" in text
    assert "its nodes kept 1.80 of the machine's 2 cores busy (one node 1.90): the cores were saturated" in text


def test_a_missed_target_with_idle_cores_says_the_ranks_waited() -> None:
    text = "\n".join(render_pipeline(_section_with_cpu(1.1, split_rate_4=12.0)))

    assert "its nodes kept 1.10 of the machine's 2 cores busy (one node 1.90): 0.90 cores were left" in text
    assert "time in which the ranks waited on each other" in text


def test_a_met_target_gives_no_reason() -> None:
    text = "\n".join(render_pipeline(_section_with_cpu(1.1, split_rate_4=16.0)))

    assert "Target: 2-node split, 4 streams ≥ 1.8× its own 1 stream: 2.00×, met." in text


def test_the_overlap_lever_is_judged_from_its_measurement() -> None:
    def overlap_run(rows: int, micro_batches: int, rate: float, *, sleep: bool = True) -> OverlapRun:
        return OverlapRun(
            rows=rows, micro_batches=micro_batches, tokens=32 * rows, wall_s=32 * rows / rate, threads_sleep=sleep
        )

    overlap = OverlapMeasurement(
        runs=[
            *(
                overlap_run(rows, micro_batches, rate)
                for rows, micro_batches, rate in ((1, 1, 5.0), (4, 1, 10.0), (4, 2, 10.2), (8, 1, 12.0), (8, 2, 15.0))
            ),
            overlap_run(1, 1, 4.0, sleep=False),
            overlap_run(4, 1, 5.0, sleep=False),
            overlap_run(4, 2, 30.0, sleep=False),
        ],
        steps=32,
        load_average=(3.0, 2.0, 1.0),
    )
    section = _section_with_cpu(1.1, split_rate_4=12.0).model_copy(update={"overlap": overlap})

    text = "\n".join(render_pipeline(section))

    assert "| sleep | 4 | 2 | 10.20 | 2.04× |" in text
    assert "| spin (default) | 4 | 1 | 5.00 | 1.25× |" in text
    # The spinning runs do not decide whether overlapping pays: a runner's threads sleep.
    assert (
        "Overlapping, idle threads sleeping: at 4 rows two micro-batches decode 1.02× one (not faster); at 8 rows "
        "two micro-batches decode 1.25× one (faster)." in text
    )
    assert "Idle threads sleeping over spinning, one micro-batch: 1.25× at 1 row, 2.00× at 4 rows." in text
