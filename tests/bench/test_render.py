"""`python -m bench --render` turns saved numbers into the Markdown report and the four charts, measuring nothing."""

from pathlib import Path

from bench.__main__ import main
from bench.charts import CHART_NAMES
from bench.results import (
    AgentSeries,
    AgentTurn,
    BenchReport,
    ConcurrencyRow,
    DecodeRow,
    MachineInfo,
    ParserCost,
)
from bench.settings import FULL
from bench.targets import EXO_NO_TOOLS, EXO_TOOLS, MLX_LM_TOOLS, RAW


def _decode(system: str, tokens_per_s: float | None) -> DecodeRow:
    return DecodeRow(
        system=system, ttft_s=2.5, decode_tokens_per_s=tokens_per_s, completion_tokens=64, prompt_tokens=80
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


def test_a_busy_machine_is_called_out_in_the_report(tmp_path: Path) -> None:
    assert "Taken with other work on the machine" in _render(tmp_path, sample_report(load_1=5.0))
