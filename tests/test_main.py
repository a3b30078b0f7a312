"""`exo` stops cleanly on Ctrl-C and SIGTERM: the terminal sends SIGINT to the whole process group (the runners too),
a stream in flight ends with its dialect's error once the grace is over, a second Ctrl-C exits at once, and a clean
stop must not read like a failure in the log. Its decode flags reach the node's configuration as one
DecodeSettings, each in its field, and a batch size below one is refused by argparse."""

import contextlib
import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Generator, Mapping
from pathlib import Path

import httpx
import pytest

from exo.main import build_parser, config_from_args
from exo.node_shutdown import SHUTDOWN_GRACE_SECONDS, SHUTDOWN_MESSAGE
from exo.shared.types.cpu_kernels import CpuKernelsReport
from exo.shared.types.footprint import held_bytes
from exo.shared.types.worker.decode_settings import DecodeSettings, LookupSettings
from exo.worker.engines.mlx.cpu.ggml_locate import find_ggml_library, ggml_missing_reason
from exo.worker.runner.idle_snapshots import SHUTDOWN_SNAPSHOT_SECONDS
from tests.exo_server import ExoServer, fixture_model, running_exo
from tests.fixtures.endless_model import MODEL as ENDLESS
from tests.fixtures.endless_model import endless_copy
from tests.fixtures.fixture_specs import GREETING_REPLY, user
from tests.machine_skips import skip_for_machine

MODEL = "tiny-qwen-tools"


def test_ctrl_c_stops_the_node_and_its_runner_without_an_error_in_the_log(tmp_path: Path) -> None:
    with _serving(fixture_model(MODEL), tmp_path) as (server, runner_pid):
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello!"}]}
        answer = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120)
        assert answer.json()["choices"][0]["message"]["content"] == GREETING_REPLY

        os.killpg(server.process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        assert server.process.wait(timeout=60) == 130
        log = server.log()
    assert " ERROR " not in log, log
    assert "Traceback" not in log, log
    assert _gone(runner_pid), log


@contextlib.contextmanager
def _serving(model: Path, tmp_path: Path) -> Generator[tuple[ExoServer, int]]:
    """A node serving `model`, and its runner's pid."""
    with running_exo([model], tmp_path, ready_timeout=300) as server:
        runner_pid = server.runner()["pid"]
        assert isinstance(runner_pid, int)
        yield server, runner_pid


def _endless(tmp_path: Path) -> Path:
    """The fixture model that never ends a reply, with room for a stream that runs for minutes (ENDLESS_STREAM)."""
    return endless_copy(tmp_path / "models-src", context_length=1 << 16)


ENDLESS_STREAM = {"model": ENDLESS, "messages": [user("Hello!")], "max_tokens": 60_000, "stream": True}


def _gone(pid: int) -> bool:
    """The process `pid` has exited (a zombie not yet reaped counts)."""
    if not Path(f"/proc/{pid}").exists():
        return True
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "Z"


def test_batching_and_speculation_are_on_by_default() -> None:
    config = config_from_args(build_parser().parse_args([]))
    assert config.decode == DecodeSettings()
    assert config.decode.batch_size == 8
    assert config.decode.speculation == LookupSettings()
    assert config_from_args(build_parser().parse_args(["--speculation"])).decode == DecodeSettings()
    assert config_from_args(build_parser().parse_args(["--no-speculation"])).decode.speculation is None


def test_the_flags_set_the_batch_size_and_turn_speculation_off() -> None:
    config = config_from_args(build_parser().parse_args(["--batch-size", "1", "--no-speculation"]))
    assert config.decode.batch_size == 1
    assert config.decode.speculation is None


def test_every_decode_flag_lands_in_its_field_of_the_decode_settings() -> None:
    flags = [
        "--batch-size=3",
        "--no-speculation",
        "--no-auto-tool-grammar",
        "--no-tool-call-repair",
        "--loop-guard=block",
        "--no-grammar-fast-forward",
        "--no-overlap",
        "--no-matmul-plan",
        "--prompt-layout=template",
    ]
    assert config_from_args(build_parser().parse_args(flags)).decode == DecodeSettings(
        batch_size=3,
        speculation=None,
        auto_tool_grammar=False,
        tool_call_repair=False,
        loop_guard="block",
        grammar_fast_forward=False,
        overlap=False,
        matmul_plan=False,
        prompt_layout="template",
    )


def test_the_prompt_layout_is_tools_first_unless_the_templates_order_is_asked_for() -> None:
    assert config_from_args(build_parser().parse_args([])).decode.prompt_layout == "tools-first"
    flagged = build_parser().parse_args(["--prompt-layout", "template"])
    assert config_from_args(flagged).decode.prompt_layout == "template"


def test_the_cpu_kernels_are_auto_by_default_and_off_on_request() -> None:
    assert config_from_args(build_parser().parse_args([])).cpu_kernels == "auto"
    assert config_from_args(build_parser().parse_args(["--cpu-kernels", "off"])).cpu_kernels == "off"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--cpu-kernels", "on"])


def test_cpu_weights_are_auto_by_default_and_int8_on_request() -> None:
    assert config_from_args(build_parser().parse_args([])).cpu_weights == "auto"
    assert config_from_args(build_parser().parse_args(["--cpu-weights", "float32"])).cpu_weights == "float32"
    assert config_from_args(build_parser().parse_args(["--cpu-weights", "int8"])).cpu_weights == "int8"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--cpu-weights", "int4"])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CPU engine applies on a Linux CPU machine")
def test_cpu_weights_int8_serves_and_says_so_in_the_ready_line_and_state(tmp_path: Path) -> None:
    """The setting reaches the runner (its weights int8, in its report and ready line) and the node's published facts
    (what placement plans memory from)."""
    with running_exo([fixture_model(MODEL)], tmp_path, ["--cpu-weights", "int8"], ready_timeout=300) as server:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello!"}]}
        answer = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120)
        assert answer.json()["choices"][0]["message"]["content"] == GREETING_REPLY
        metadata = server.runner()["metadata"]
        nodes = server.state()["nodes"]
        log = server.log()
    assert isinstance(metadata, dict)
    assert metadata["dtype"] == "int8"
    # The runner reports the bytes it holds: about one a parameter (float32 would hold four).
    parameters = metadata["checkpoint"]["parameter_count"]  # pyright: ignore[reportIndexIssue, reportUnknownVariableType, reportCallIssue, reportArgumentType]
    assert isinstance(parameters, int)
    assert isinstance(metadata["weights_bytes"], int)
    assert parameters < metadata["weights_bytes"] < 2 * parameters
    report = CpuKernelsReport.model_validate(metadata["cpu_kernels"])
    assert report.weights == "int8"
    assert {state.name: state.on for state in report.replacements}["int8_weights"]
    assert "int8 weights (MKL s8u8s32)" in log
    assert isinstance(nodes, dict)
    assert [node["facts"]["cpu_weights"] for node in nodes.values()] == ["int8"]  # pyright: ignore[reportUnknownVariableType, reportIndexIssue]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CPU engine applies on a Linux CPU machine")
@pytest.mark.parametrize("ggml", ["found", "missing"])
def test_cpu_weights_auto_serves_q8_0_where_ggml_is_found_and_float32_saying_how_to_build_it_where_not(
    tmp_path: Path, ggml: str
) -> None:
    """The default: the runner resolves `auto` (its report and /state say q8_0 or float32, never `auto`), the node
    publishes what it plans memory with, /v1/models reports the memory of what is held, and without ggml the
    startup log and the runner's ready line and report name the command that turns the quantized path on."""
    library = find_ggml_library()
    if ggml == "found" and library is None:
        skip_for_machine(ggml_missing_reason())
    # The test node's own EXO_HOME has no ggml build cache: point at the library, or at a folder without it.
    where = str(library) if ggml == "found" and library is not None else str(tmp_path / "no-ggml")
    arguments = ["--cpu-weights", "auto"]
    with running_exo([fixture_model(MODEL)], tmp_path, arguments, {"EXO_GGML_DIR": where}, ready_timeout=300) as server:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello!"}]}
        answer = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120)
        assert answer.json()["choices"][0]["message"]["content"] == GREETING_REPLY
        metadata = server.runner()["metadata"]
        nodes = server.state()["nodes"]
        cards = httpx.get(f"{server.base_url}/v1/models", timeout=30).json()["data"]
        log = server.log()
    held, node = ("q8_0", "gguf_or_q8_0") if ggml == "found" else ("float32", "float32")
    assert isinstance(metadata, dict)
    assert metadata["dtype"] == held
    report = CpuKernelsReport.model_validate(metadata["cpu_kernels"])
    assert (report.weights, report.weights_setting) == (held, "auto")
    assert isinstance(nodes, dict)
    assert [node["facts"]["cpu_weights"] for node in nodes.values()] == [node]  # pyright: ignore[reportUnknownVariableType, reportIndexIssue]
    parameters = metadata["checkpoint"]["parameter_count"]  # pyright: ignore[reportIndexIssue, reportUnknownVariableType, reportCallIssue, reportArgumentType]
    assert isinstance(parameters, int)
    [card] = [card for card in cards if card["id"] == MODEL]  # pyright: ignore[reportUnknownVariableType]
    assert card["weights_in_memory"] == held
    assert card["memory_bytes"] == held_bytes(parameters, 0, weights=held)
    if ggml == "found":
        assert report.weights_note is None
        assert "quantized weights off" not in log
        assert "Q8_0 weights (ggml)" in log
    else:
        assert report.weights_note is not None
        assert "`uv run exo ggml build`" in report.weights_note
        # Once at start (the node's warning) and once in the runner's ready line.
        assert log.count(report.weights_note) == 2, log


def test_cpu_kernels_off_serves_and_says_so_in_the_ready_line_and_state(tmp_path: Path) -> None:
    with running_exo([fixture_model(MODEL)], tmp_path, ["--cpu-kernels", "off"], ready_timeout=300) as server:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello!"}]}
        answer = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120)
        assert answer.json()["choices"][0]["message"]["content"] == GREETING_REPLY
        metadata = server.runner()["metadata"]
        log = server.log()
    assert isinstance(metadata, dict)
    assert metadata["dtype"] == "native"
    assert metadata["matmul_plan"] is None
    report = CpuKernelsReport.model_validate(metadata["cpu_kernels"])
    assert report.setting == "off"
    assert {(state.on, state.why_off) for state in report.replacements} == {(False, "--cpu-kernels off")}
    assert "is ready; CPU kernels: off: all off (--cpu-kernels off): stock mlx-lm" in log
    blas = metadata["blas"]
    assert isinstance(blas, dict)
    assert blas["kind"] == ("reference" if sys.platform.startswith("linux") else "accelerate")  # nothing preloaded


@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_a_batch_size_below_one_or_not_a_number_is_a_usage_error(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["--batch-size", value])
    assert exited.value.code == 2
    assert "--batch-size" in capsys.readouterr().err


def test_the_parallel_flag_chooses_how_a_placed_model_is_split() -> None:
    assert config_from_args(build_parser().parse_args([])).parallel == "auto"
    config = config_from_args(build_parser().parse_args(["--min-nodes", "2", "--parallel", "tensor"]))
    assert (config.min_nodes, config.parallel) == (2, "tensor")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--parallel", "sideways"])


# What a stream in flight may take past the grace to end, and a stopped node past the runner's snapshot bound to exit.
STREAM_END_SLACK_SECONDS = 5
EXIT_SLACK_SECONDS = 10
# An event carrying generated text, in the chat or Messages dialect.
TEXT_FLOWS = re.compile(r'"(content|text)":"[^"]')


def _stream_until_stopped(
    server: ExoServer, path: str, body: Mapping[str, object], stop: Callable[[], None]
) -> list[str]:
    """Stream `body` from `path`; once text flows, call `stop`; the events read to the end of the stream."""
    lines: list[str] = []
    with httpx.stream("POST", f"{server.base_url}{path}", json=body, timeout=120) as stream:
        events = stream.iter_lines()
        for line in events:
            lines.append(line)
            if TEXT_FLOWS.search(line):
                break
        stop()
        with contextlib.suppress(httpx.HTTPError):
            lines.extend(events)
    return lines


@pytest.mark.parametrize(
    ("stop_signal", "status", "dialect"),
    [(signal.SIGTERM, 0, "/v1/chat/completions"), (signal.SIGINT, 130, "/v1/messages")],
    ids=["sigterm-chat", "ctrl-c-messages"],
)
def test_a_stop_signal_ends_a_long_stream_with_the_dialects_error_and_the_node_exits_cleanly(
    tmp_path: Path, stop_signal: signal.Signals, status: int, dialect: str
) -> None:
    """A stream that would run for minutes does not hold the node: after the grace it ends with the dialect's error
    event saying the node is shutting down, the runner is stopped and the node exits with the documented status,
    its log free of tracebacks. Ctrl-C goes to the whole process group, as a terminal sends it."""
    with _serving(_endless(tmp_path), tmp_path) as (server, runner_pid):
        signalled = 0.0

        def stop() -> None:
            nonlocal signalled
            if stop_signal == signal.SIGINT:
                os.killpg(server.process.pid, signal.SIGINT)
            else:
                server.process.send_signal(stop_signal)
            signalled = time.monotonic()

        lines = _stream_until_stopped(server, dialect, ENDLESS_STREAM, stop)
        stream_ended = time.monotonic() - signalled
        assert server.process.wait(timeout=60) == status
        stopped = time.monotonic() - signalled
        log = server.log()
    errors = [
        json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: {") and "error" in line
    ]
    assert errors, lines[-5:]
    error = errors[-1]["error"]
    assert error["message"] == SHUTDOWN_MESSAGE, error
    if dialect == "/v1/messages":
        assert "event: error" in lines, lines[-5:]
    else:
        assert error["code"] == "model_unavailable", error
        assert [line for line in lines if line][-1] == "data: [DONE]", lines[-5:]
    assert SHUTDOWN_GRACE_SECONDS - 1 <= stream_ended <= SHUTDOWN_GRACE_SECONDS + STREAM_END_SLACK_SECONDS, stream_ended
    assert stopped <= SHUTDOWN_GRACE_SECONDS + SHUTDOWN_SNAPSHOT_SECONDS + EXIT_SLACK_SECONDS, stopped
    assert "Traceback" not in log, log
    assert " ERROR " not in log, log
    assert _gone(runner_pid), log


def test_a_node_serving_no_request_exits_promptly_on_sigterm(tmp_path: Path) -> None:
    with _serving(fixture_model(MODEL), tmp_path) as (server, runner_pid):
        server.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert server.process.wait(timeout=60) == 0
        stopped = time.monotonic() - signalled
        log = server.log()
    assert stopped < 4, (stopped, log)
    assert "Traceback" not in log, log
    assert _gone(runner_pid), log


def test_a_second_ctrl_c_exits_at_once_without_waiting_for_the_grace(tmp_path: Path) -> None:
    with _serving(_endless(tmp_path), tmp_path) as (server, runner_pid):
        signalled = 0.0

        def stop_twice() -> None:
            nonlocal signalled
            os.killpg(server.process.pid, signal.SIGINT)
            signalled = time.monotonic()
            time.sleep(0.5)
            os.killpg(server.process.pid, signal.SIGINT)

        _stream_until_stopped(server, "/v1/chat/completions", ENDLESS_STREAM, stop_twice)
        assert server.process.wait(timeout=60) == 130
        stopped = time.monotonic() - signalled
        log = server.log()
    assert stopped < SHUTDOWN_GRACE_SECONDS - 1, (stopped, log)
    assert "Traceback" not in log, log
    assert _gone(runner_pid), log
