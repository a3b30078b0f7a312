"""`uv run python -m bench [--model SPEC] [--quick] [--output PATH] [--note TEXT] [--results-json PATH]`.

Measures and writes the report; `--render JSON` re-renders a saved run without measuring; `--only SECTION --base
JSON` measures that section alone (constrained, speculation, parser, or the server sections together) and renders it
together with the other sections' saved numbers. Section 6
(BLAS candidates on Linux x86_64) is measured only that way: `--only blas --base JSON [--blas-library PATH]`, and so is
section 8 (one model over 1, 2 and 3 local nodes): `--only pipeline --base JSON`.

`--only llama-cpp` (exo with float32 and with int8 weights, llama.cpp's llama-server and mlx_lm.server on the
default model's GGUF: `bench.llama_cpp`) and `--only kernels` (candidate kernels for quantized weights:
`bench.quant_kernels`) need no --base: they print their own Markdown section (and `--results-json` saves their
figures)."""

import argparse
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from bench.agent_sessions import measure_agent_sessions
from bench.blas_section import measure_blas
from bench.charts import write_charts
from bench.constrained import measure_constrained
from bench.machine import machine_info, record_start_commit, section_run
from bench.parser_cost import measure_parser_cost
from bench.pipeline_section import measure_pipeline
from bench.report import render_markdown
from bench.results import (
    AgentSessionsScope,
    BenchReport,
    BenchSettings,
    ConstrainedSettings,
    SectionKey,
    SectionRun,
    SpeculationSettings,
)
from bench.server_sections import measure_with_servers
from bench.settings import (
    CONSTRAINED_FULL,
    CONSTRAINED_QUICK,
    FULL,
    QUICK,
    SPECULATION_FULL,
    SPECULATION_QUICK,
)
from bench.speculation import measure_speculation
from exo.models.paths import default_models_dir
from exo.models.resolve import ResolvedModel, resolve_model

REPOSITORY_ROOT = Path(__file__).resolve().parent.parent
QUICK_MODEL = REPOSITORY_ROOT / "tests" / "fixtures" / "models" / "tiny-qwen-tools"
DEFAULT_OUTPUT = REPOSITORY_ROOT / "docs" / "PERFORMANCE.md"
AGENT_SESSIONS_MAX_TOKENS = 32
"""Answer length per request of section 9 (which `--quick` leaves out: the tiny model's context cannot hold an
agent's prompt)."""
STANDALONE_SECTIONS = ("llama-cpp", "kernels")
"""Sections measured and printed by their own module, outside the report `--base` holds."""
SECTIONS = (
    "constrained",
    "blas",
    "speculation",
    "servers",
    "pipeline",
    "parser",
    "agent-sessions",
    *STANDALONE_SECTIONS,
)
"""Sections `--only` can measure alone; `servers` is decode, agent turns, concurrency and arrivals together (they
share the servers one run starts)."""


_SECTION_KEYS: dict[str, SectionKey] = {
    "constrained": "constrained",
    "speculation": "speculation",
    "pipeline": "pipeline",
    "servers": "servers",
    "parser": "parser",
    "agent-sessions": "agent-sessions",
}
"""Where an `--only` run of each section records its run in the report."""


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
    parser.add_argument(
        "--agent-sessions",
        choices=("full", "claude-code"),
        default="full",
        help="with --only agent-sessions: replay every workload, or only the captured Claude Code first request "
        "(cold, again, after a restart), which a slow machine can run on both systems in minutes",
    )
    return parser


def _progress(message: str) -> None:
    sys.stderr.write(f"[bench {time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


def run_bench(
    model: ResolvedModel,
    settings: BenchSettings,
    constrained: ConstrainedSettings,
    speculation: SpeculationSettings,
    work_dir: Path,
    *,
    arguments: Sequence[str] = (),
) -> BenchReport:
    """Measure every section on `model`; every subprocess is stopped before returning, also on errors. `arguments`
    (the bench's command line) is recorded with each section."""
    started = time.monotonic()
    runs: dict[SectionKey, SectionRun] = {}
    _progress("tool-stream parser cost")
    parser = measure_parser_cost(settings.parser_sizes, settings.parser_segment_chars, settings.parser_repeats)
    runs["parser"] = section_run(arguments)
    servers = measure_with_servers(model.path, settings, work_dir, _progress)
    runs["servers"] = section_run(arguments)
    _progress("grammar-constrained decoding: compile times, then decode per tool_choice in turn")
    constrained_report = measure_constrained(model.path, constrained)
    runs["constrained"] = section_run(arguments)
    _progress("prompt-lookup speculation: edit, file rewrite and free text, speculation off and on in turn")
    speculation_report = measure_speculation(model.path, speculation)
    runs["speculation"] = section_run(arguments)
    agent_sessions = None
    if settings is not QUICK:  # the tiny model's context cannot hold an agent's prompt
        _progress("agent sessions: cold, warm and after a restart, exo then mlx_lm.server")
        agent_sessions = measure_agent_sessions(
            model.model_id, model.path, work_dir, AGENT_SESSIONS_MAX_TOKENS, _progress
        )
        runs["agent-sessions"] = section_run(arguments)
    return BenchReport(
        runs=runs,
        model_id=model.model_id,
        model_path=str(model.path),
        settings=settings,
        machine=machine_info(servers.matmul_gflops),
        decode=servers.decode,
        agent=servers.agent,
        parser=parser,
        concurrency=servers.concurrency,
        arrival=servers.arrival,
        batch_pass_seconds=servers.batch_pass_seconds,
        planned_batch_pass_seconds=servers.planned_batch_pass_seconds,
        wall_s=time.monotonic() - started,
        constrained=constrained_report,
        speculation=speculation_report,
        agent_sessions=agent_sessions,
    )


def _exit_on_signal(signal_number: int, _frame: FrameType | None) -> None:
    sys.exit(128 + signal_number)


def _resolve(model_spec: str | None, *, quick: bool) -> ResolvedModel:
    spec = str(QUICK_MODEL) if quick and model_spec is None else model_spec
    model = resolve_model(spec, default_models_dir())
    _progress(f"model {model.model_id} at {model.path}; {'quick' if quick else 'full'} run")
    return model


def _measure(model_spec: str | None, arguments: Sequence[str], *, quick: bool) -> BenchReport:
    model = _resolve(model_spec, quick=quick)
    settings, constrained = (QUICK, CONSTRAINED_QUICK) if quick else (FULL, CONSTRAINED_FULL)
    speculation = SPECULATION_QUICK if quick else SPECULATION_FULL
    with tempfile.TemporaryDirectory(prefix="exo-bench-") as scratch:
        return run_bench(model, settings, constrained, speculation, Path(scratch), arguments=arguments)


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
    return base.model_copy(update={"blas": section, "runs": {**base.runs, "blas": section_run(arguments.command)}})


def _measure_speculation_on_other_model(base: BenchReport, model: ResolvedModel, *, quick: bool) -> BenchReport:
    """The saved report with section 7 measured on `model` too (replacing an earlier measurement on it)."""
    _progress(f"prompt-lookup speculation on {model.model_id}: edit, file rewrite and free text")
    measured = measure_speculation(model.path, SPECULATION_QUICK if quick else SPECULATION_FULL)
    measured = measured.model_copy(update={"model_id": model.model_id})
    others = [other for other in base.speculation_other_models if other.model_id != model.model_id]
    return base.model_copy(update={"speculation_other_models": [*others, measured]})


def _measure_section_into(
    section: str,
    base_path: Path,
    model_spec: str | None,
    command: Sequence[str],
    *,
    quick: bool,
    sessions_scope: AgentSessionsScope = "full",
) -> BenchReport:
    """The saved report at `base_path` with `section` measured afresh on its model (or on `model_spec`)."""
    base = BenchReport.model_validate_json(base_path.read_text())
    model = _resolve(model_spec or base.model_path, quick=quick)
    if model.model_id != base.model_id and section == "speculation":
        return _measure_speculation_on_other_model(base, model, quick=quick)
    if model.model_id != base.model_id:
        raise SystemExit(
            f"--base holds numbers for {base.model_id}, not {model.model_id}: only the speculation section can be "
            "measured on another model"
        )
    started = time.monotonic()
    update: dict[str, object]
    match section:
        case "constrained":
            _progress("grammar-constrained decoding: compile times, then decode per tool_choice in turn")
            update = {"constrained": measure_constrained(model.path, CONSTRAINED_QUICK if quick else CONSTRAINED_FULL)}
        case "speculation":
            _progress("prompt-lookup speculation: edit, file rewrite and free text, speculation off and on in turn")
            update = {"speculation": measure_speculation(model.path, SPECULATION_QUICK if quick else SPECULATION_FULL)}
        case "parser":
            settings = QUICK if quick else FULL
            _progress("tool-stream parser cost")
            update = {
                "parser": measure_parser_cost(
                    settings.parser_sizes, settings.parser_segment_chars, settings.parser_repeats
                )
            }
        case "agent-sessions":
            with tempfile.TemporaryDirectory(prefix="exo-bench-") as scratch:
                sessions = measure_agent_sessions(
                    model.model_id,
                    model.path,
                    Path(scratch),
                    AGENT_SESSIONS_MAX_TOKENS,
                    _progress,
                    scope=sessions_scope,
                )
            update = {"agent_sessions": sessions}
        case "pipeline":
            nodes, max_tokens, requests, overlap_steps = ((1, 2), 8, 1, 8) if quick else ((1, 2, 3), 48, 3, 32)
            update = {
                "pipeline": measure_pipeline(
                    model.model_id,
                    model.path,
                    nodes,
                    max_tokens,
                    requests,
                    overlap_steps=overlap_steps,
                    progress=_progress,
                )
            }
        case _:
            settings = QUICK if quick else FULL
            with tempfile.TemporaryDirectory(prefix="exo-bench-") as scratch:
                servers = measure_with_servers(model.path, settings, Path(scratch), _progress)
            update = {
                "settings": settings,
                "machine": machine_info(servers.matmul_gflops),
                "decode": servers.decode,
                "agent": servers.agent,
                "concurrency": servers.concurrency,
                "arrival": servers.arrival,
                "batch_pass_seconds": servers.batch_pass_seconds,
                "planned_batch_pass_seconds": servers.planned_batch_pass_seconds,
                "wall_s": time.monotonic() - started,
                "servers_measured_apart": True,
            }
    _progress(f"section measured in {time.monotonic() - started:.0f} s")
    runs = {**base.runs, _SECTION_KEYS[section]: section_run(command)}
    return base.model_copy(update={**update, "runs": runs})


def standalone_command(section: str, model_spec: str | None, results_json: Path | None) -> list[str]:
    """The command line of the module that measures a standalone section, for `--only` to hand over to."""
    arguments = ["--json", str(results_json)] if results_json is not None else []
    if section == "kernels":
        return arguments
    return [*(["--model", model_spec] if model_spec else []), *arguments]


def _run_standalone(section: str, model_spec: str | None, results_json: Path | None) -> None:
    command = standalone_command(section, model_spec, results_json)
    if section == "kernels":
        from bench.quant_kernels import main as kernels_main

        kernels_main(command)
    else:
        from bench.llama_cpp import main as llama_cpp_main

        llama_cpp_main(command)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the suite and write the Markdown report and its charts."""
    parser = build_parser()
    command = list(sys.argv[1:] if argv is None else argv)
    arguments = parser.parse_args(command)
    arguments.command = command
    if arguments.only in STANDALONE_SECTIONS:
        if arguments.base is not None or arguments.render is not None:
            parser.error(f"--only {arguments.only} measures and prints its own section: no --base or --render")
        _run_standalone(arguments.only, arguments.model, arguments.results_json)
        return
    if (arguments.only is None) != (arguments.base is None):
        parser.error("--only and --base go together")
    if arguments.agent_sessions != "full" and arguments.only != "agent-sessions":
        parser.error("--agent-sessions goes with --only agent-sessions")
    if arguments.render is not None:
        report = BenchReport.model_validate_json(arguments.render.read_text())
    else:
        if arguments.only == "blas":
            report = _measure_blas_into(arguments.base, arguments.model, arguments)
        elif arguments.only is not None:
            report = _measure_section_into(
                arguments.only,
                arguments.base,
                arguments.model,
                command,
                quick=arguments.quick,
                sessions_scope=arguments.agent_sessions,
            )
        else:
            report = _measure(arguments.model, command, quick=arguments.quick)
        if arguments.results_json is not None:  # first, so the measurements survive whatever rendering does
            arguments.results_json.parent.mkdir(parents=True, exist_ok=True)
            arguments.results_json.write_text(report.model_dump_json(indent=2))
    output: Path = arguments.output
    output.parent.mkdir(parents=True, exist_ok=True)
    write_charts(report, output.parent / "perf")
    output.write_text(render_markdown(report, list(arguments.note)))
    _progress(f"wrote {output} and charts in {output.parent / 'perf'} ({report.wall_s:.0f} s)")


if __name__ == "__main__":
    # Turn SIGTERM into SystemExit so the `finally` blocks stop exo and mlx_lm.server (they run in their own sessions
    # and would otherwise outlive us). Only here: a test calling main() keeps its own process's handlers.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    record_start_commit()  # here, not in main(): a test calling main() must not leave it in its own environment
    main()
