"""`uv run python -m bench [--model SPEC] [--quick] [--output PATH] [--note TEXT] [--results-json PATH]`.

Measures and writes the report; `--render JSON` re-renders a saved run without measuring; `--only constrained
--base JSON` measures that section alone and renders it together with the other sections' saved numbers. Section 6
(BLAS candidates on Linux x86_64) is measured only that way: `--only blas --base JSON [--blas-library PATH]`."""

import argparse
import asyncio
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

import httpx

from bench.blas_section import measure_blas
from bench.charts import write_charts
from bench.constrained import measure_constrained
from bench.machine import machine_info
from bench.parser_cost import measure_parser_cost
from bench.raw_baseline import RawBaseline, running_raw_baseline
from bench.report import render_markdown
from bench.results import (
    AgentSeries,
    BenchReport,
    BenchSettings,
    ConcurrencyRow,
    ConstrainedSettings,
    DecodeRow,
)
from bench.sections import (
    measure_agent,
    measure_concurrency,
    measure_decode,
    raw_contender,
    server_contender,
    warm_up,
)
from bench.servers import RunningServer, running_exo, running_mlx_lm_server
from bench.settings import CONSTRAINED_FULL, CONSTRAINED_QUICK, FULL, QUICK
from bench.targets import RAW
from bench.workloads import agent_tools
from exo.models.paths import default_models_dir
from exo.models.resolve import ResolvedModel, resolve_model

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
QUICK_MODEL = REPOSITORY_ROOT / "tests" / "fixtures" / "models" / "tiny-qwen-tools"
DEFAULT_OUTPUT = REPOSITORY_ROOT / "docs" / "PERFORMANCE.md"
SECTIONS = ("constrained", "blas")
"""Sections `--only` can measure alone (the others share servers that one run starts)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description="Benchmark exo against mlx-lm baselines.")
    parser.add_argument("--model", help="model spec as `exo --model` takes it (default: exo's default model)")
    parser.add_argument("--quick", action="store_true", help="smoke run on the tiny fixture model, few tokens")
    parser.add_argument(
        "--output", type=Path, default=DEFAULT_OUTPUT, help="Markdown file; charts go to perf/ beside it"
    )
    parser.add_argument("--note", action="append", default=[], help="a line for the report's Notes (repeatable)")
    parser.add_argument("--results-json", type=Path, help="also save the measured numbers as JSON here")
    parser.add_argument(
        "--render", type=Path, metavar="JSON", help="measure nothing: render the report from a --results-json file"
    )
    parser.add_argument(
        "--only", choices=SECTIONS, help="measure this section alone; the rest of the report comes from --base"
    )
    parser.add_argument(
        "--base", type=Path, metavar="JSON", help="with --only: a --results-json file holding the other sections"
    )
    parser.add_argument(
        "--blas-library",
        type=Path,
        action="append",
        default=[],
        help="with --only blas: also measure this cblas library (repeatable), e.g. an unpacked distribution package",
    )
    parser.add_argument(
        "--blas-library-path", help="with --blas-library: LD_LIBRARY_PATH for those libraries' own dependencies"
    )
    parser.add_argument("--blas-rounds", type=int, default=3, help="with --only blas: rounds of all candidates")
    return parser


def _progress(message: str) -> None:
    sys.stderr.write(f"[bench {time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


async def _measure_servers(
    raw: RawBaseline, exo: RunningServer, peer: RunningServer, settings: BenchSettings
) -> tuple[list[DecodeRow], list[AgentSeries], list[ConcurrencyRow]]:
    async with httpx.AsyncClient() as client:
        for server in (exo, peer):
            await warm_up(client, server)
        tokens = settings.decode_max_tokens
        tools = agent_tools(settings.agent_tool_count)
        _progress("decode without tools: raw, exo, mlx_lm.server in turn")
        plain = [raw_contender(RAW, raw, tokens), *(server_contender(client, s, [], tokens) for s in (exo, peer))]
        decode = await measure_decode(plain, settings.decode_repeats)
        _progress("decode with tools: exo, mlx_lm.server in turn")
        with_tools = [server_contender(client, server, tools, tokens) for server in (exo, peer)]
        decode += await measure_decode(with_tools, settings.decode_repeats)
        _progress("agent turns: exo, mlx_lm.server in turn")
        agent = await measure_agent(client, (exo, peer), settings)
        _progress("concurrent exo streams")
        concurrency = await measure_concurrency(client, exo, settings)
    return decode, agent, concurrency


def run_bench(
    model: ResolvedModel, settings: BenchSettings, constrained: ConstrainedSettings, work_dir: Path
) -> BenchReport:
    """Measure every section on `model`; every subprocess is stopped before returning, also on errors."""
    started = time.monotonic()
    _progress("tool-stream parser cost")
    parser = measure_parser_cost(settings.parser_sizes, settings.parser_segment_chars, settings.parser_repeats)
    float32_copy = work_dir / "float32-model"
    # All three stay loaded for the whole run so their runs can alternate (the machine has memory for three copies
    # of a small model; none of them uses CPU while idle).
    _progress("starting the raw mlx-lm baseline, exo and mlx_lm.server")
    with (
        running_raw_baseline(model.path, float32_copy) as raw,
        running_exo(model.path, work_dir) as exo,
        running_mlx_lm_server(float32_copy, work_dir) as peer,
    ):
        decode, agent, concurrency = asyncio.run(_measure_servers(raw, exo, peer, settings))
    _progress("grammar-constrained decoding: compile times, then decode per tool_choice in turn")
    constrained_report = measure_constrained(model.path, constrained)
    return BenchReport(
        model_id=model.model_id,
        model_path=str(model.path),
        settings=settings,
        machine=machine_info(raw.ready.matmul_gflops),
        decode=decode,
        agent=agent,
        parser=parser,
        concurrency=concurrency,
        wall_s=time.monotonic() - started,
        constrained=constrained_report,
    )


def _exit_on_signal(signal_number: int, _frame: FrameType | None) -> None:
    sys.exit(128 + signal_number)


def _resolve(model_spec: str | None, *, quick: bool) -> ResolvedModel:
    # Turn SIGTERM into SystemExit so the `finally` blocks stop exo and mlx_lm.server (they run in their own sessions
    # and would otherwise outlive us).
    signal.signal(signal.SIGTERM, _exit_on_signal)
    spec = str(QUICK_MODEL) if quick and model_spec is None else model_spec
    model = resolve_model(spec, default_models_dir())
    _progress(f"model {model.model_id} at {model.path}; {'quick' if quick else 'full'} run")
    return model


def _measure(model_spec: str | None, *, quick: bool) -> BenchReport:
    model = _resolve(model_spec, quick=quick)
    settings, constrained = (QUICK, CONSTRAINED_QUICK) if quick else (FULL, CONSTRAINED_FULL)
    with tempfile.TemporaryDirectory(prefix="exo-bench-") as scratch:
        return run_bench(model, settings, constrained, Path(scratch))


def _measure_blas_into(base_path: Path, model_spec: str | None, arguments: argparse.Namespace) -> BenchReport:
    """The saved report at `base_path` with section 6 (BLAS candidates) measured afresh on its model."""
    base = BenchReport.model_validate_json(base_path.read_text())
    model = _resolve(model_spec or base.model_path, quick=arguments.quick)
    started = time.monotonic()
    section = measure_blas(
        model.model_id,
        model.path,
        1 if arguments.quick else arguments.blas_rounds,
        extra_libraries=arguments.blas_library,
        extra_library_path=arguments.blas_library_path,
        progress=_progress,
    )
    _progress(f"section measured in {time.monotonic() - started:.0f} s")
    return base.model_copy(update={"blas": section})


def _measure_constrained_into(base_path: Path, model_spec: str | None, *, quick: bool) -> BenchReport:
    """The saved report at `base_path` with section 5 measured afresh on its model (or on `model_spec`)."""
    base = BenchReport.model_validate_json(base_path.read_text())
    model = _resolve(model_spec or base.model_path, quick=quick)
    if model.model_id != base.model_id:
        raise SystemExit(f"--base holds numbers for {base.model_id}, not {model.model_id}: one report, one model")
    started = time.monotonic()
    _progress("grammar-constrained decoding: compile times, then decode per tool_choice in turn")
    section = measure_constrained(model.path, CONSTRAINED_QUICK if quick else CONSTRAINED_FULL)
    _progress(f"section measured in {time.monotonic() - started:.0f} s")
    return base.model_copy(update={"constrained": section})


def main(argv: Sequence[str] | None = None) -> None:
    """Run the suite and write the Markdown report and its charts."""
    parser = build_parser()
    arguments = parser.parse_args(argv)
    if (arguments.only is None) != (arguments.base is None):
        parser.error("--only and --base go together")
    if arguments.render is not None:
        report = BenchReport.model_validate_json(arguments.render.read_text())
    else:
        if arguments.only == "blas":
            report = _measure_blas_into(arguments.base, arguments.model, arguments)
        elif arguments.only is not None:
            report = _measure_constrained_into(arguments.base, arguments.model, quick=arguments.quick)
        else:
            report = _measure(arguments.model, quick=arguments.quick)
        if arguments.results_json is not None:
            arguments.results_json.write_text(report.model_dump_json(indent=2))
    output: Path = arguments.output
    output.parent.mkdir(parents=True, exist_ok=True)
    write_charts(report, output.parent / "perf")
    output.write_text(render_markdown(report, list(arguments.note)))
    _progress(f"wrote {output} and charts in {output.parent / 'perf'} ({report.wall_s:.0f} s)")


if __name__ == "__main__":
    main()
