"""The prompt layouts side by side on one model: `--prompt-layout template` (the chat template's order) against
`tools-first` (the tool definitions before the client's system text), two nodes, greedy.

1. Tool-call validity under `tool_choice: "auto"` over the tool corpus (bench/tool_corpus.py), each prompt with a
   client-like system text that names a project folder, as coding agents' do; and greedy agreement: the share of
   prompts whose reply (text and calls) is the same in both layouts.
2. Cache reuse across folders: the run's first prompt sent in one folder, then in another; the second request's
   cached prompt tokens in each layout (in memory, same node).

    uv run python -m bench.prompt_layout --model ~/.cache/exo/models/qwen2.5-coder-0.5b-instruct --out r.json

`--skip N` starts at corpus prompt N + 1 (to measure a long corpus in pieces, on fresh nodes each time; the
pieces' counts add up); `--limit N` uses the first N prompts from there; `--minutes M` stops taking new prompts once
M minutes have passed since the nodes were ready, and reports those measured (the report says which of the corpus).
Prints a markdown report with the run's commit, CPU, load and command.
"""

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import httpx
from pydantic import BaseModel

from bench.machine import record_start_commit, section_run
from bench.markdown import without_directories
from bench.results import SectionRun
from bench.servers import RunningServer, running_exo
from bench.tool_calls_auto import verdict
from bench.tool_corpus import CORPUS, TOOLS, ToolPrompt

REQUEST_TIMEOUT_S: Final = 900.0
LAYOUTS: Final = ("template", "tools-first")
# Both nodes compute alike, so only the layout differs; without the matmul plan a node is ready once loaded (its idle
# refinement of the plan kept a node from counting as ready for over ten minutes on a busy machine).
NODE_FLAGS: Final = ("--no-matmul-plan",)
# A coding agent's system text: its own words, then facts of the session such as the working directory.
SYSTEM_TEXT: Final = (
    "You are a helpful assistant with tools. Call a tool when the user's request needs one; otherwise answer.\n"
    "Working directory: {folder}\nPlatform: linux"
)


class LayoutRow(BaseModel):
    layout: str
    valid: int
    invalid: int
    no_call: int
    problems: list[str]


class CacheRow(BaseModel):
    layout: str
    prompt_tokens: int
    cached_tokens_in_second_folder: int


class Report(BaseModel):
    run: SectionRun
    load_at_start: tuple[float, float, float]
    model: str
    prompts: int
    # The corpus number (from 1) of the run's first prompt: runs in pieces start further in.
    first_prompt: int = 1
    corpus_prompts: int = len(CORPUS)
    validity: list[LayoutRow]
    same_replies: int
    # Corpus numbers of the prompts whose replies differ between the layouts.
    different_replies: list[int] = []
    cache: list[CacheRow]


def _body(model: str, item: ToolPrompt, folder: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [
            {"role": "system", "content": SYSTEM_TEXT.format(folder=folder)},
            {"role": "user", "content": item.prompt},
        ],
        "tools": list(TOOLS),
        "temperature": 0.0,
        "max_tokens": max_tokens,
    }


def _chat(server: RunningServer, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=REQUEST_TIMEOUT_S)
    response.raise_for_status()
    reply: dict[str, Any] = response.json()
    return reply


def reply_of(reply: dict[str, Any]) -> tuple[str, list[tuple[str, str]]]:
    message = reply["choices"][0]["message"]
    calls = [(call["function"]["name"], call["function"]["arguments"]) for call in message.get("tool_calls") or []]
    return message.get("content") or "", calls


def layout_row(layout: str, replies: Sequence[dict[str, Any]]) -> LayoutRow:
    verdicts = [verdict(reply) for reply in replies]
    return LayoutRow(
        layout=layout,
        valid=sum(v == "valid" for v, _ in verdicts),
        invalid=sum(v == "invalid" for v, _ in verdicts),
        no_call=sum(v == "no_call" for v, _ in verdicts),
        problems=[problem for v, problem in verdicts if v == "invalid"],
    )


def _cache_row(layout: str, server: RunningServer, model: str, item: ToolPrompt, max_tokens: int) -> CacheRow:
    _chat(server, _body(model, item, "/home/user/first-project", max_tokens))
    second = _chat(server, _body(model, item, "/srv/work/another-project", max_tokens))["usage"]
    details = second.get("prompt_tokens_details") or {}
    return CacheRow(
        layout=layout,
        prompt_tokens=second["prompt_tokens"],
        cached_tokens_in_second_folder=details.get("cached_tokens") or 0,
    )


def run(
    model_path: Path,
    corpus: Sequence[ToolPrompt],
    max_tokens: int,
    command: Sequence[str],
    *,
    minutes: float | None = None,
    first_prompt: int = 1,
) -> Report:
    load_at_start = os.getloadavg()
    model = model_path.name
    with (
        tempfile.TemporaryDirectory(prefix="bench-prompt-layout-") as scratch,
        running_exo(
            model_path, Path(scratch), [*NODE_FLAGS, "--prompt-layout", "template"], name="exo-template"
        ) as template,
        running_exo(
            model_path, Path(scratch), [*NODE_FLAGS, "--prompt-layout", "tools-first"], name="exo-tools-first"
        ) as moved,
    ):
        servers = dict(zip(LAYOUTS, (template, moved), strict=True))
        deadline = None if minutes is None else time.monotonic() + minutes * 60
        # Cache first, on cold nodes: the corpus would otherwise have cached the tool block already.
        cache = [_cache_row(layout, server, model, corpus[0], max_tokens) for layout, server in servers.items()]
        replies: dict[str, list[dict[str, Any]]] = {layout: [] for layout in LAYOUTS}
        # The layouts take turns per prompt, so load falls on both alike; `number` is the corpus's, as in a whole run.
        for number, item in enumerate(corpus, first_prompt):
            if deadline is not None and time.monotonic() > deadline:
                print(f"--minutes {minutes}: stopping before prompt {number}", file=sys.stderr, flush=True)
                break
            for layout, server in servers.items():
                replies[layout].append(_chat(server, _body(model, item, f"/home/user/project-{number}", max_tokens)))
            verdicts = ", ".join(f"{layout}: {verdict(found[-1])[0]}" for layout, found in replies.items())
            print(f"[{number}/{len(CORPUS)}] {verdicts}", file=sys.stderr, flush=True)
    different = [
        number
        for number, first, second in zip(
            range(first_prompt, first_prompt + len(corpus)), replies["template"], replies["tools-first"], strict=False
        )
        if reply_of(first) != reply_of(second)
    ]
    same = len(replies["template"]) - len(different)
    return Report(
        run=section_run(command, program="uv run python -m bench.prompt_layout"),
        load_at_start=load_at_start,
        model=model,
        prompts=len(replies["template"]),
        first_prompt=first_prompt,
        corpus_prompts=len(CORPUS),
        validity=[layout_row(layout, found) for layout, found in replies.items()],
        same_replies=same,
        different_replies=different,
        cache=cache,
    )


def markdown(report: Report) -> str:
    run = report.run
    load = " / ".join(f"{value:.1f}" for value in report.load_at_start)
    last = report.first_prompt + report.prompts - 1
    lines = [
        f"Commit {run.exo_commit}, {run.cpu}, model {report.model}, finished {run.finished_utc}; load average {load} "
        f"at the start, {' / '.join(f'{value:.1f}' for value in run.load_average)} at the end; greedy. Command: "
        f"`{without_directories(run.command)}`.",
        "",
        f'Schema-valid calls under `tool_choice: "auto"` over {report.prompts} of the corpus\'s '
        f"{report.corpus_prompts} prompts (numbers {report.first_prompt}–{last}), each with a system text naming a "
        "project folder:",
        "",
        "| Layout | valid calls | invalid calls | no call |",
        "|---|---|---|---|",
        *(f"| {row.layout} | {row.valid} | {row.invalid} | {row.no_call} |" for row in report.validity),
        "",
        f"Same reply (text and calls) in both layouts: {report.same_replies}/{report.prompts}"
        + (f" (different: {', '.join(map(str, report.different_replies))})." if report.different_replies else "."),
        "",
        f"Prompt {report.first_prompt} in one folder, then in another (the second request):",
        "",
        "| Layout | prompt tokens | cached tokens |",
        "|---|---|---|",
        *(f"| {row.layout} | {row.prompt_tokens} | {row.cached_tokens_in_second_folder} |" for row in report.cache),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    record_start_commit()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--skip", type=int, default=0, help="start after the first N corpus prompts (runs in pieces)")
    parser.add_argument("--limit", type=int, help="only the first N prompts from there (a quick look)")
    parser.add_argument("--minutes", type=float, help="take no new prompt after this many minutes")
    parser.add_argument("--max-tokens", type=int, default=256)
    command = list(sys.argv[1:] if argv is None else argv)
    arguments = parser.parse_args(command)
    if not 0 <= arguments.skip < len(CORPUS):
        parser.error(f"--skip takes 0 to {len(CORPUS) - 1}: the corpus has {len(CORPUS)} prompts")
    corpus = CORPUS[arguments.skip :]
    corpus = corpus[: arguments.limit] if arguments.limit else corpus
    report = run(
        arguments.model.expanduser(),
        corpus,
        arguments.max_tokens,
        command,
        minutes=arguments.minutes,
        first_prompt=arguments.skip + 1,
    )
    if arguments.out:
        arguments.out.write_text(json.dumps(report.model_dump(mode="json"), indent=2))
    print(markdown(report))


if __name__ == "__main__":
    main()
