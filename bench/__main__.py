"""`uv run python -m bench [--model SPEC] [--quick] [--output PATH] [--note TEXT]`: measure and write the report."""

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from bench.charts import write_charts
from bench.machine import machine_info
from bench.parser_cost import measure_parser_cost
from bench.report import render_markdown
from bench.results import AgentSeries, BenchReport, BenchSettings, ConcurrencyRow, DecodeRow
from bench.sections import (
    decode_row,
    measure_agent,
    measure_concurrency,
    measure_decode,
    run_raw_baseline,
    warm_up,
)
from bench.servers import RunningServer, running_exo, running_mlx_lm_server
from bench.settings import FULL, QUICK
from bench.targets import RAW
from exo.models.resolve import ResolvedModel, default_models_dir, resolve_model

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
QUICK_MODEL = REPOSITORY_ROOT / "tests" / "fixtures" / "models" / "tiny-qwen-tools"
DEFAULT_OUTPUT = REPOSITORY_ROOT / "docs" / "PERFORMANCE.md"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description="Benchmark exo against mlx-lm baselines.")
    parser.add_argument("--model", help="model spec as `exo --model` takes it (default: exo's default model)")
    parser.add_argument("--quick", action="store_true", help="smoke run on the tiny fixture model, few tokens")
    parser.add_argument(
        "--output", type=Path, default=DEFAULT_OUTPUT, help="Markdown file; charts go to perf/ beside it"
    )
    parser.add_argument("--note", action="append", default=[], help="a line for the report's Notes (repeatable)")
    return parser


def _progress(message: str) -> None:
    sys.stderr.write(f"[bench {time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


class _ServerResults:
    def __init__(self) -> None:
        self.decode: list[DecodeRow] = []
        self.agent: AgentSeries | None = None
        self.concurrency: list[ConcurrencyRow] = []


async def _measure_server(server: RunningServer, settings: BenchSettings, with_concurrency: bool) -> _ServerResults:
    results = _ServerResults()
    async with httpx.AsyncClient() as client:
        await warm_up(client, server)
        for with_tools in (False, True):
            _progress(f"{server.name}: decode, {'with' if with_tools else 'no'} tools")
            results.decode.append(await measure_decode(client, server, settings, with_tools))
        _progress(f"{server.name}: agent turns")
        results.agent = await measure_agent(client, server, settings)
        if with_concurrency:
            _progress(f"{server.name}: concurrent streams")
            results.concurrency = await measure_concurrency(client, server, settings)
    return results


def run_bench(model: ResolvedModel, settings: BenchSettings, work_dir: Path) -> BenchReport:
    """Measure every section on `model`, one system after another; every subprocess is stopped before returning."""
    started = time.monotonic()
    _progress("tool-stream parser cost")
    parser = measure_parser_cost(settings.parser_sizes, settings.parser_segment_chars, settings.parser_repeats)
    _progress("raw mlx-lm baseline (subprocess)")
    float32_copy = work_dir / "float32-model"
    raw = run_raw_baseline(model.path, settings, float32_copy)
    _progress("exo")
    with running_exo(model.path, work_dir) as exo:
        exo_results = asyncio.run(_measure_server(exo, settings, with_concurrency=True))
    _progress("mlx_lm.server")
    with running_mlx_lm_server(float32_copy, work_dir) as peer:
        peer_results = asyncio.run(_measure_server(peer, settings, with_concurrency=False))
    agent = [series for series in (exo_results.agent, peer_results.agent) if series is not None]
    return BenchReport(
        model_id=model.model_id,
        model_path=str(model.path),
        settings=settings,
        machine=machine_info(raw.matmul_gflops),
        decode=[decode_row(RAW, raw.runs), *exo_results.decode, *peer_results.decode],
        agent=agent,
        parser=parser,
        concurrency=exo_results.concurrency,
        wall_s=time.monotonic() - started,
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Run the suite and write the Markdown report and its charts."""
    arguments = build_parser().parse_args(argv)
    settings = QUICK if arguments.quick else FULL
    spec: str | None = str(QUICK_MODEL) if arguments.quick and arguments.model is None else arguments.model
    model = resolve_model(spec, default_models_dir())
    _progress(f"model {model.model_id} at {model.path}; {'quick' if settings.quick else 'full'} run")
    with tempfile.TemporaryDirectory(prefix="exo-bench-") as scratch:
        report = run_bench(model, settings, Path(scratch))
    output: Path = arguments.output
    output.parent.mkdir(parents=True, exist_ok=True)
    write_charts(report, output.parent / "perf")
    output.write_text(render_markdown(report, list(arguments.note)))
    _progress(f"wrote {output} and charts in {output.parent / 'perf'} ({report.wall_s:.0f} s)")


if __name__ == "__main__":
    main()
