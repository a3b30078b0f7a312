"""`python -m bench --render` turns saved numbers into the Markdown report and the four charts, measuring nothing."""

from pathlib import Path

from bench.__main__ import main
from bench.charts import CHART_NAMES
from bench.results import (
    AgentSeries,
    AgentTurn,
    ArrivalRow,
    BenchReport,
    ConcurrencyRow,
    DecodeRow,
    MachineInfo,
    ParserCost,
    SpeculationReport,
    SpeculationRow,
    SpeculationSettings,
)
from bench.settings import FULL
from bench.targets import EXO_NO_TOOLS, EXO_TOOLS, MLX_LM_TOOLS, RAW


def _decode(system: str, tokens_per_s: float | None) -> DecodeRow:
    """Five rounds that all move together (the same load on every system), so the paired ratios are steady."""
    runs: list[float | None] = (
        [] if tokens_per_s is None else [tokens_per_s * factor for factor in (0.95, 1.0, 0.98, 1.02, 0.97)]
    )
    return DecodeRow(
        system=system,
        ttft_s=2.5,
        decode_tokens_per_s=tokens_per_s,
        completion_tokens=64,
        prompt_tokens=80,
        runs=runs,
    )


def _agent(system: str, ttfts: list[float]) -> AgentSeries:
    turns = [
        AgentTurn(turn=number, prompt_tokens=3000 + number, cached_tokens=0 if number == 1 else 2990, ttft_s=ttft)
        for number, ttft in enumerate(ttfts, start=1)
    ]
    return AgentSeries(system=system, turns=turns)


def sample_report(load_1: float) -> BenchReport:
    """A plausible full-run report; `load_1` is the 1-minute load average it records."""
    machine = MachineInfo(
        platform="Linux-test",
        python="3.11.7",
        cpu_count=2,
        load_average=(load_1, 1.0, 1.0),
        mlx_version="0.32.4",
        mlx_lm_version="0.32.2",
        blas="openblas",
        matmul_gflops=300.0,
        exo_commit="abc1234",
    )
    return BenchReport(
        model_id="test-model",
        model_path="/models/test-model",
        settings=FULL,
        machine=machine,
        decode=[
            _decode(RAW, 6.40),
            _decode(EXO_NO_TOOLS, 6.30),
            _decode(EXO_TOOLS, 6.10),
            _decode("mlx_lm.server streaming, no tools", 6.20),
            _decode(MLX_LM_TOOLS, None),
        ],
        agent=[_agent("exo", [30.0, 2.0, 2.5, 5.0]), _agent("mlx_lm.server", [31.0, 3.0, 3.5, 4.0])],
        parser=[
            ParserCost(argument_bytes=1_000, segments=265, microseconds_per_segment=2.5, chars_examined_per_char=3.1),
            ParserCost(
                argument_bytes=100_000, segments=25_015, microseconds_per_segment=2.75, chars_examined_per_char=3.0
            ),
        ],
        concurrency=[
            ConcurrencyRow(streams=1, aggregate_tokens_per_s=6.0, per_stream_tokens_per_s=5.5, mean_ttft_s=1.0),
            ConcurrencyRow(streams=2, aggregate_tokens_per_s=6.1, per_stream_tokens_per_s=2.9, mean_ttft_s=3.0),
        ],
        wall_s=700.0,
    )


def _render(tmp_path: Path, report: BenchReport) -> str:
    saved = tmp_path / "results.json"
    saved.write_text(report.model_dump_json())
    output = tmp_path / "out" / "PERFORMANCE.md"
    main(["--render", str(saved), "--output", str(output), "--note", "rendered in a test"])
    return output.read_text()


def test_rendered_report_states_ratios_verdicts_and_unmeasurable_speeds(tmp_path: Path) -> None:
    document = _render(tmp_path, sample_report(load_1=0.2))
    assert "| exo streaming, no tools | 6.30 | 0.984× |" in document
    assert "2 of 4 targets met." in document
    assert "worst 0.167× (turn 4)" in document
    assert "| mlx_lm.server streaming, with tools | n/a | n/a |" in document
    assert "- rendered in a test" in document
    assert "other work on the machine" not in document
    for name in CHART_NAMES:
        assert (tmp_path / "out" / "perf" / name).stat().st_size > 1000


def test_the_run_row_says_whether_the_server_sections_came_from_a_run_of_their_own(tmp_path: Path) -> None:
    full = sample_report(load_1=0.2)
    apart = full.model_copy(update={"wall_s": 1234.0, "servers_measured_apart": True})

    assert "| Run | full run, 700 s in all |" in _render(tmp_path, full)
    assert "| Run | sections 1, 2 and 4 in one `--only servers` full run (1234 s);" in _render(tmp_path, apart)


def test_a_busy_machine_is_called_out_in_the_report(tmp_path: Path) -> None:
    assert "Taken with other work on the machine" in _render(tmp_path, sample_report(load_1=5.0))


def test_throughput_sections_render_every_system_the_arrivals_and_speculation(tmp_path: Path) -> None:
    rows = [
        ConcurrencyRow(
            system=system, streams=streams, aggregate_tokens_per_s=speed, per_stream_tokens_per_s=1.0, mean_ttft_s=0.5
        )
        for system, speeds in (("exo", (5.0, 12.5)), ("exo --batch-size 1", (5.0, 5.1)), ("mlx_lm.server", (4.8, 12.0)))
        for streams, speed in zip((1, 4), speeds, strict=True)
    ]
    arrival = [ArrivalRow(system="exo", running_streams=3, ttft_s=0.9, alone_ttft_s=0.4)]
    speculation = SpeculationReport(
        settings=SpeculationSettings(max_tokens=128, repeats=2),
        prompt_tokens={"opencode edit": 900, "free text": 60},
        rows=[
            _speculation_row("opencode edit", "off", [4.0, 4.2], drafted=0, accepted=0, passes=256),
            _speculation_row("opencode edit", "on (default)", [7.0, 7.4], drafted=110, accepted=100, passes=40),
        ],
        pass_cost_ratios={1: 1.0, 8: 1.9},
        load_average=(3.0, 2.0, 1.0),
        exo_commit="abc1234",
    )
    bigger = speculation.model_copy(update={"model_id": "bigger-coder", "exo_commit": "def5678"})
    report = sample_report(load_1=0.2).model_copy(
        update={
            "concurrency": rows,
            "arrival": arrival,
            "speculation": speculation,
            "speculation_other_models": [bigger],
            "batch_pass_seconds": {1: 0.1, 4: 0.21},
            "planned_batch_pass_seconds": {1: 0.08, 4: 0.12},
        }
    )
    document = _render(tmp_path, report)
    assert "### The same workloads on bigger-coder" in document
    assert "Measured at commit def5678" in document
    # The batching ceiling the batched step costs allow, in bare mlx-lm and through exo's matmul plan.
    assert "| 4 | 210.0 | 2.10× | 1.90× | 120.0 | 1.50× | 2.67× |" in document
    assert "| 4 | exo --batch-size 1 | 5.10 |" in document
    assert "| 4 | exo | 12.50 |" in document
    assert "| exo | 3 | 0.90 | 0.40 |" in document
    assert "| opencode edit | on (default) | 7.20 | 7.00, 7.40 | 1.756× | 100/110 | 6.40 | yes |" in document
    assert "8: 1.90×" in document
    assert "exo aggregate tok/s at 4 streams ≥ 2.5× one stream" in document
    for name in CHART_NAMES:
        assert (tmp_path / "out" / "perf" / name).stat().st_size > 1000


def _speculation_row(
    workload: str, mode: str, speeds: list[float], *, drafted: int, accepted: int, passes: int
) -> SpeculationRow:
    return SpeculationRow(
        workload=workload,
        mode=mode,
        tokens_per_s=speeds,
        median_tokens_per_s=sum(speeds) / len(speeds),
        completion_tokens=128,
        drafted=drafted,
        accepted=accepted,
        forward_passes=passes,
        same_tokens_as_off=True,
        text="edit(",
    )
