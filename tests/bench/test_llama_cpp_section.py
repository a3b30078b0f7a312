"""The llama.cpp side-by-side section without llama.cpp: its command lines, memory reading, request shapes and
Markdown, including the report of a run where llama-server was not built or did not start, and which GGUF it serves."""

import argparse
import os
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from bench.__main__ import build_parser as bench_parser
from bench.__main__ import standalone_command
from bench.joined_gguf import joined_gguf, served_gguf
from bench.llama_cpp import (
    EXO,
    EXO_GGUF,
    EXO_INT8,
    LLAMA_CPP,
    MLX_LM,
    LlamaCppReport,
    SystemFigures,
    llama_server_arguments,
    llama_settings,
    parse_systems,
    prefill_messages,
    prefill_rate,
    process_tree_residents,
    resident_bytes,
    start_server,
)
from bench.report_llama_cpp import render_llama_cpp
from bench.results import SectionRun, StreamMeasurement
from bench.servers import free_port, serving
from bench.stream_client import StreamOutcome
from exo.models.gguf_source import KEPT_GGUF_NAME, record_gguf


def test_llama_server_is_started_on_the_gguf_with_its_template_and_two_threads() -> None:
    arguments = llama_server_arguments(Path("/b/llama-server"), Path("/m/model.gguf"), 4242)
    assert arguments[0] == "/b/llama-server"
    pairs = dict(zip(arguments[1::2], arguments[2::2], strict=False))
    assert pairs["--model"] == "/m/model.gguf"
    assert pairs["--port"] == "4242"
    assert pairs["--host"] == "127.0.0.1"
    assert pairs["--threads"] == "2"
    assert pairs["--parallel"] == "8"
    assert "--jinja" in arguments
    four_slots = llama_server_arguments(Path("/b/s"), Path("/m.gguf"), 1, slots=4)
    assert four_slots[four_slots.index("--parallel") + 1] == "4"


def test_resident_memory_of_this_process_tree(tmp_path: Path) -> None:
    own = resident_bytes(Path(f"/proc/{os.getpid()}/status"))
    assert own > 10_000_000  # a Python process with pytest loaded
    assert sum(process_tree_residents(os.getpid())) >= own
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        residents: list[int] = []
        for _ in range(100):  # until the child's interpreter is resident
            residents = process_tree_residents(os.getpid())
            if len(residents) >= 2 and min(residents) > 1_000_000:
                break
            time.sleep(0.05)
        assert len(residents) >= 2  # this process, then its descendants
        assert residents[0] > 10_000_000
        assert min(residents) > 1_000_000
    finally:
        child.kill()
        child.wait()
    status = tmp_path / "status"
    status.write_text("Name:\tx\nVmRSS:\t  2048 kB\n")
    assert resident_bytes(status) == 2048 * 1024
    assert resident_bytes(tmp_path / "gone") == 0


def test_prefill_prompts_differ_from_the_first_line_and_are_long() -> None:
    first, second = prefill_messages("a"), prefill_messages("b")
    assert first[0].content != second[0].content
    assert isinstance(first[0].content, str)
    assert len(first[0].content) > 12_000
    assert first[1:] == second[1:]


def _outcome(prompt_tokens: int, ttft_s: float) -> StreamOutcome:
    measurement = StreamMeasurement(
        ttft_s=ttft_s, total_s=ttft_s, completion_tokens=1, prompt_tokens=prompt_tokens, cached_tokens=0, text="x"
    )
    return StreamOutcome(measurement=measurement, tool_call=None)


def test_prefill_rate_needs_the_prompt_token_count() -> None:
    assert prefill_rate(_outcome(3000, 30.0)) == pytest.approx(100.0)
    assert prefill_rate(_outcome(0, 30.0)) is None


def test_systems_parse() -> None:
    assert parse_systems("exo,llama.cpp") == [EXO, LLAMA_CPP]
    assert parse_systems("exo,exo int8,llama.cpp") == [EXO, EXO_INT8, LLAMA_CPP]
    with pytest.raises(argparse.ArgumentTypeError, match="subset"):
        parse_systems("exo,ollama")


def test_bench_hands_standalone_sections_their_own_command_line() -> None:
    arguments = bench_parser().parse_args(["--only", "llama-cpp", "--results-json", "r.json"])
    assert arguments.only == "llama-cpp"
    assert standalone_command("llama-cpp", "qwen2.5-coder-1.5b-instruct", Path("r.json")) == [
        "--model",
        "qwen2.5-coder-1.5b-instruct",
        "--json",
        "r.json",
    ]
    assert standalone_command("kernels", "ignored", None) == []


def test_a_model_without_gguf_pieces_has_no_joined_gguf(tmp_path: Path) -> None:
    path, reason = joined_gguf("some-local-model", tmp_path)
    assert path is None
    assert reason is not None
    assert "not a catalogue model" in reason


def _run() -> SectionRun:
    return SectionRun(
        exo_commit="abc1234",
        cpu="2 × Test CPU",
        load_average=(2.0, 2.0, 2.0),
        command="uv run python -m bench.llama_cpp",
        finished_utc="2026-11-28 13:00 UTC",
    )


def test_side_by_side_table_with_ratios() -> None:
    exo = SystemFigures(
        system=EXO,
        served="its import",
        prompt_tokens=2900,
        prefill_tokens_per_s=[50.0, 70.0],
        decode_tokens_per_s=[6.0],
        streams_tokens_per_s={1: [5.0], 4: [7.0], 8: [9.0]},
        resident_bytes=2_500_000_000,
        valid=10,
        no_call=2,
    )
    llama = SystemFigures(
        system=LLAMA_CPP,
        served="the GGUF",
        prompt_tokens=2901,
        prefill_tokens_per_s=[90.0],
        decode_tokens_per_s=[30.0],
        streams_tokens_per_s={1: [25.0], 4: [24.0], 8: [30.0]},
        resident_bytes=500_000_000,
        valid=3,
        invalid=9,
    )
    report = LlamaCppReport(
        run=_run(),
        load_at_start=(1.0, 1.0, 1.0),
        model_id="m",
        gguf="/g/m.gguf",
        gguf_bytes=491_400_064,
        llama_server="/b/llama-server",
        llama_server_settings=["LLAMA_ARG_REPACK=0"],
        rounds=2,
        tool_prompts=12,
        systems=[exo, llama],
    )
    text = "\n".join(render_llama_cpp(report))
    assert "| Measure | exo | llama.cpp | exo ÷ llama.cpp |" in text
    assert "| prefill, a 2900-token prompt (tok/s) | 50.0, 70.0 | 90.0 | 0.67× |" in text
    assert "| decode, one stream (tok/s) | 6.0 | 30.0 | 0.20× |" in text
    assert "| 8 streams at once, 48 tokens each, prefill included (tok/s, all streams) | 9.0 | 30.0 | 0.30× |" in text
    assert "| resident memory of the server's processes (GB) | 2.5 | 0.5 | 0.20× |" in text
    assert "10 valid, 0 invalid, 2 without a call (of 12)" in text
    assert "0.49 GB" in text
    assert "llama-server's environment options: LLAMA_ARG_REPACK=0." in text
    assert "not measured" not in text


def test_a_run_without_llama_server_says_why_and_shows_the_rest() -> None:
    mlx_lm = SystemFigures(system=MLX_LM, served="a float32 copy", decode_tokens_per_s=[6.5])
    report = LlamaCppReport(
        run=_run(),
        load_at_start=(1.0, 1.0, 1.0),
        model_id="m",
        gguf=None,
        gguf_bytes=None,
        llama_server=None,
        not_started={LLAMA_CPP: "llama-server 11434.0.0 is not built"},
        rounds=1,
        tool_prompts=4,
        systems=[SystemFigures(system=EXO, served="its import", decode_tokens_per_s=[6.0]), mlx_lm],
    )
    text = "\n".join(render_llama_cpp(report))
    assert "**llama.cpp not started**: llama-server 11434.0.0 is not built." in text
    assert "| Measure | exo | mlx_lm.server | llama.cpp |" in text
    assert "| decode, one stream (tok/s) | 6.0 | 6.5 | not started |" in text
    assert "(of 4) | not started |" in text
    assert "exo ÷ llama.cpp" not in text
    assert "no GGUF found" in text
    assert "llama-server ran with" not in text  # it never ran: the report says only what ran


def test_a_built_llama_server_that_did_not_start_is_not_said_to_have_run() -> None:
    report = LlamaCppReport(
        run=_run(),
        load_at_start=(1.0, 1.0, 1.0),
        model_id="qwen2.5-coder-1.5b-instruct",
        gguf=None,
        gguf_bytes=None,
        llama_server="/b/llama-server",
        llama_server_settings=["LLAMA_ARG_REPACK=0"],
        not_started={LLAMA_CPP: "m kept no GGUF from its import, and the GGUF pieces are not installed"},
        rounds=1,
        tool_prompts=4,
        systems=[SystemFigures(system=EXO_GGUF, served="its import", decode_tokens_per_s=[13.9])],
    )
    text = "\n".join(render_llama_cpp(report))
    assert "| Measure | exo gguf | llama.cpp |" in text
    assert "| decode, one stream (tok/s) | 13.9 | not started |" in text
    assert "**llama.cpp not started**: m kept no GGUF" in text
    assert "llama-server ran with" not in text
    assert "LLAMA_ARG_REPACK" not in text


def test_a_model_directory_with_its_kept_gguf_serves_that_file_to_llama_cpp(tmp_path: Path) -> None:
    # The 1.5B's pieces were not installed, but its directory kept the GGUF exo gguf serves: llama.cpp gets it too.
    model_dir = tmp_path / "qwen2.5-coder-1.5b-instruct"
    model_dir.mkdir()
    scratch = model_dir / "scratch.gguf"
    scratch.write_bytes(b"GGUF" + bytes(60))
    record_gguf(model_dir, scratch, {}, move=True)
    path, reason = served_gguf(model_dir, "some-local-model", tmp_path / "joined")
    assert (path, reason) == (model_dir / KEPT_GGUF_NAME, None)
    assert not (tmp_path / "joined").exists()  # nothing joined or copied
    (model_dir / KEPT_GGUF_NAME).write_bytes(b"GGUF changed")  # no longer the version imported
    path, reason = served_gguf(model_dir, "some-local-model", tmp_path / "joined")
    assert path is None
    assert reason is not None
    assert "kept no GGUF" in reason
    assert "not a catalogue model" in reason


def test_a_server_that_exits_at_start_is_recorded_as_not_started(tmp_path: Path) -> None:
    not_started: dict[str, str] = {}
    with ExitStack() as stack:
        server = serving(
            name=LLAMA_CPP,
            arguments=[sys.executable, "-c", "import sys; print('error: cannot load model'); sys.exit(3)"],
            env=dict(os.environ),
            log_dir=tmp_path,
            port=free_port(),
            ready=lambda _url, _log: False,
        )
        assert start_server(stack, LLAMA_CPP, server, not_started) is None
    assert list(not_started) == [LLAMA_CPP]
    assert "server exited with 3" in not_started[LLAMA_CPP]
    assert "error: cannot load model" in not_started[LLAMA_CPP]


def test_llama_settings_are_the_llama_arg_variables() -> None:
    assert llama_settings({"LLAMA_ARG_REPACK": "0", "PATH": "/bin", "LLAMA_ARG_FLASH_ATTN": "off"}) == [
        "LLAMA_ARG_FLASH_ATTN=off",
        "LLAMA_ARG_REPACK=0",
    ]


def test_both_exo_weight_formats_get_a_ratio_to_llama_cpp() -> None:
    def figures(system: str, decode: float, resident: int) -> SystemFigures:
        return SystemFigures(system=system, served="x", decode_tokens_per_s=[decode], resident_bytes=resident)

    report = LlamaCppReport(
        run=_run(),
        cpu_flags="avx2 fma",
        load_at_start=(1.0, 1.0, 1.0),
        model_id="m",
        gguf="/g/m.gguf",
        gguf_bytes=491_400_064,
        llama_server="/b/llama-server",
        llama_slots=4,
        rounds=1,
        tool_prompts=2,
        systems=[
            figures(EXO, 5.0, 3_000_000_000),
            figures(EXO_INT8, 10.0, 1_000_000_000),
            figures(LLAMA_CPP, 20.0, 800_000_000),
        ],
    )
    text = "\n".join(render_llama_cpp(report))
    assert "| Measure | exo | exo int8 | llama.cpp | exo ÷ llama.cpp | exo int8 ÷ llama.cpp |" in text
    assert "| decode, one stream (tok/s) | 5.0 | 10.0 | 20.0 | 0.25× | 0.50× |" in text
    assert "| resident memory of the server's processes (GB) | 3.0 | 1.0 | 0.8 | 0.27× | 0.80× |" in text
    assert "2 × Test CPU (avx2 fma)" in text
    assert "`--threads 2 --ctx-size 32768 --parallel 4 --jinja`" in text
