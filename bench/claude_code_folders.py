"""Claude Code's real first request in a new project folder: how much of it the prefix cache serves, per prompt layout.

`bench/claude_code_first_request.json` is the body Claude Code 2.1.197 sent for `claude -p "List the files in this
project."` with the settings `exo launch claude` sets (captured by a recording server; its 24 tools, ~64k characters
of definitions, and its system text, which names the working directory). Only the folder (and a session id in the
metadata) changed between captures in two folders, so a folder is substituted into the one capture.

Per layout, one node at a time with its own EXO_HOME: the request from a first folder (cold), then from a second
folder (the cache in memory), then the node is stopped after its runner wrote its prefix-cache snapshots, started
again on the same EXO_HOME, and the request is sent from a third folder (the disk tier). Sent as Claude Code sends it:
Anthropic Messages, streamed, greedy, a few tokens.

Where the cache can serve only the start of the prompt (the template's order, whose system text with the folder
comes before the tools), reading the rest takes a CPU many minutes and changes nothing measured: with `--lookup-only
template` such a request is read only until the node's first keep-alive comment (`: prefill done/total tokens (N
cached)`, sent after 10 s of prefill), which carries what the prefix cache served, and is then cancelled (the node
stops within a second). The first folder's request is always read whole: it is what fills the cache.

    uv run python -m bench.claude_code_folders --model ~/.cache/exo/models/qwen2.5-coder-0.5b-instruct

`--layout` measures one layout only; `--cpu-weights` sets the node's weight format (float32 unless named). Prints a
markdown report with the run's commit, CPU, load and command.
"""

import argparse
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, Literal

import httpx
from pydantic import BaseModel

from bench.agent_sessions import wait_for_snapshots
from bench.machine import record_start_commit, section_run
from bench.markdown import markdown_table, without_directories
from bench.results import SectionRun
from bench.servers import RunningServer, running_exo

CAPTURE: Final = Path(__file__).with_name("claude_code_first_request.json")
CAPTURED_FOLDER: Final = "/home/user/alpha-project"
FOLDERS: Final = ("/home/user/alpha-project", "/home/user/beta-service", "/srv/work/gamma-tool")
LAYOUTS: Final = ("template", "tools-first")
REQUEST_TIMEOUT_S: Final = 3600.0
MAX_TOKENS: Final = 8
NODE_FLAGS: Final = ("--no-matmul-plan",)

# The keep-alive comment a streamed answer sends during a prefill (exo.api.request_log, `where`).
PREFILL_COMMENT: Final = re.compile(r"^: prefill (\d+)/(\d+) tokens \((\d+) cached\)")

Phase = Literal["cold", "memory", "restarted"]


class FolderRow(BaseModel):
    layout: str
    folder: str
    phase: Phase
    prompt_tokens: int
    cached_tokens: int
    # None where the request was cancelled once the cache lookup was known (--lookup-only).
    seconds: float | None


class Report(BaseModel):
    run: SectionRun
    load_at_start: tuple[float, float, float]
    model: str
    rows: list[FolderRow]


def request_in(folder: str, model: str) -> dict[str, Any]:
    """The captured request as Claude Code sends it from `folder`, for `model`, greedy and short."""
    text = CAPTURE.read_text()
    if text.count(CAPTURED_FOLDER) != 1:
        raise ValueError(f"the capture names {CAPTURED_FOLDER} {text.count(CAPTURED_FOLDER)} times, not once")
    body: dict[str, Any] = json.loads(text.replace(CAPTURED_FOLDER, folder))
    return {**body, "model": model, "stream": True, "max_tokens": MAX_TOKENS, "temperature": 0.0}


def prefill_comment(line: str) -> tuple[int, int] | None:
    """(prompt tokens, cached tokens) from a keep-alive comment sent during a prefill, else None."""
    found = PREFILL_COMMENT.match(line)
    return None if found is None else (int(found.group(2)), int(found.group(3)))


def usage_event(line: str) -> tuple[int, int] | None:
    """(prompt tokens, cached tokens) from the message_delta event's usage line, else None."""
    if not line.startswith("data: "):
        return None
    event = json.loads(line.removeprefix("data: "))
    if event.get("type") != "message_delta":
        return None
    usage = event["usage"]
    cached = usage.get("cache_read_input_tokens") or 0
    return usage["input_tokens"] + cached, cached


def _send(server: RunningServer, layout: str, folder: str, phase: Phase, model: str, *, lookup_only: bool) -> FolderRow:
    started = time.monotonic()
    found: tuple[int, int] | None = None
    with httpx.stream(
        "POST", f"{server.base_url}/v1/messages", json=request_in(folder, model), timeout=REQUEST_TIMEOUT_S
    ) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if lookup_only and (found := prefill_comment(line)) is not None:
                break  # leaving the stream cancels the request
            found = usage_event(line) or found
    if found is None:
        raise RuntimeError(f"{layout} {phase}: the stream carried no usage")
    prompt_tokens, cached = found
    row = FolderRow(
        layout=layout,
        folder=folder,
        phase=phase,
        prompt_tokens=prompt_tokens,
        cached_tokens=cached,
        seconds=None if lookup_only else time.monotonic() - started,
    )
    print(f"{layout} {phase} {folder}: {cached}/{prompt_tokens} cached, {row.seconds} s", file=sys.stderr, flush=True)
    return row


def measure_layout(
    model_path: Path, scratch: Path, layout: str, *, lookup_only: bool, cpu_weights: str = "float32"
) -> list[FolderRow]:
    home = scratch / f"home-{layout}"
    flags = [*NODE_FLAGS, "--prompt-layout", layout, "--cpu-weights", cpu_weights]
    model = model_path.name
    with running_exo(model_path, scratch, flags, name=f"exo-{layout}", home=home) as server:
        rows = [
            _send(server, layout, FOLDERS[0], "cold", model, lookup_only=False),
            _send(server, layout, FOLDERS[1], "memory", model, lookup_only=lookup_only),
        ]
        wait_for_snapshots(home / "prefix-cache")
    with running_exo(model_path, scratch, flags, name=f"exo-{layout}-restarted", home=home) as server:
        rows.append(_send(server, layout, FOLDERS[2], "restarted", model, lookup_only=lookup_only))
    return rows


def markdown(report: Report) -> str:
    run = report.run
    load = " / ".join(f"{value:.1f}" for value in report.load_at_start)
    end = " / ".join(f"{value:.1f}" for value in run.load_average)
    lines = [
        f"Commit {run.exo_commit}, {run.cpu}, model {report.model}, finished {run.finished_utc}; load average {load} "
        f"at the start, {end} at the end. Command: `{without_directories(run.command)}`.",
        "",
    ]
    rows = [
        [
            row.layout,
            row.phase,
            row.folder,
            str(row.prompt_tokens),
            str(row.cached_tokens),
            "cancelled after the lookup" if row.seconds is None else f"{row.seconds:.1f}",
        ]
        for row in report.rows
    ]
    lines += markdown_table(["Layout", "Cache", "Folder", "Prompt tokens", "Cached tokens", "Seconds"], rows)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    record_start_commit()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--layout", choices=LAYOUTS, action="append", help="measure this layout only (repeatable)")
    parser.add_argument(
        "--lookup-only",
        choices=LAYOUTS,
        action="append",
        default=[],
        help="for this layout, read the second and third folders' requests only until the cache lookup is known",
    )
    parser.add_argument(
        "--cpu-weights",
        choices=("float32", "q8_0", "gguf", "auto"),
        default="float32",
        help="the node's --cpu-weights (float32 unless named, so a report says which format it measured)",
    )
    parser.add_argument("--out", type=Path)
    command = list(sys.argv[1:] if argv is None else argv)
    arguments = parser.parse_args(command)
    load_at_start = os.getloadavg()
    model_path: Path = arguments.model.expanduser()
    rows: list[FolderRow] = []
    with tempfile.TemporaryDirectory(prefix="bench-claude-code-folders-") as scratch:
        for layout in arguments.layout or LAYOUTS:
            lookup_only = layout in arguments.lookup_only
            rows += measure_layout(
                model_path, Path(scratch), layout, lookup_only=lookup_only, cpu_weights=arguments.cpu_weights
            )
    report = Report(
        run=section_run(command, program="uv run python -m bench.claude_code_folders"),
        load_at_start=load_at_start,
        model=model_path.name,
        rows=rows,
    )
    if arguments.out:
        arguments.out.write_text(json.dumps(report.model_dump(mode="json"), indent=2))
    print(markdown(report))


if __name__ == "__main__":
    main()
