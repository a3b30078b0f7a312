"""The `tool-calls-auto` section, side by side in one run on one model:

1. share of schema-valid calls under `tool_choice: "auto"` over the corpus (bench/tool_corpus.py): exo with its
   lazy grammar, exo with it off (`auto_tool_grammar: false`) with and without the repair of failed calls
   (`tool_call_repair`), and mlx_lm.server on the same weights (`--no-mlx-lm` leaves it out), given a float32
   copy of them as exo's runner loads them on a CPU (bench/float32_weights.py);
2. end-to-end latency of `required` calls to tools with at least four fields, exo with grammar fast-forward against
   a second exo node started with `--no-grammar-fast-forward` (requests alternate between the two);
3. decode speed of replies without calls (tools offered), lazy grammar on against off.

    uv run python -m bench.tool_calls_auto --model ~/.cache/exo/models/qwen2.5-coder-0.5b-instruct --out r.json

`--only validity|latency|overhead` (repeatable) runs only those parts. Everything greedy (temperature 0). Prints a
markdown report with the run's commit, CPU, load and command; `--out` also writes the raw figures as JSON.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Literal, cast

import httpx
import jsonschema
from pydantic import BaseModel

from bench.float32_weights import float32_copy
from bench.machine import record_start_commit, section_run
from bench.markdown import without_directories
from bench.results import SectionRun
from bench.servers import RunningServer, running_exo, running_mlx_lm_server
from bench.tool_corpus import CORPUS, FORCED, PROSE, TOOLS, ToolPrompt

REQUEST_TIMEOUT_S = 900.0
_SYSTEMS: dict[str, dict[str, Any]] = {
    "exo, lazy grammar": {"auto_tool_grammar": True},
    "exo, grammar off, repair on": {"auto_tool_grammar": False, "tool_call_repair": True},
    "exo, grammar off, no repair": {"auto_tool_grammar": False, "tool_call_repair": False},
}
Verdict = Literal["valid", "invalid", "no_call"]
Part = Literal["validity", "latency", "overhead"]
PARTS: tuple[Part, ...] = ("validity", "latency", "overhead")


class ValidityRow(BaseModel):
    system: str
    valid: int
    invalid: int
    no_call: int
    problems: list[str]


class LatencyRow(BaseModel):
    prompt: str
    fast_forward_s: float
    step_by_step_s: float
    same_calls: bool
    tokens: int
    """Completion tokens of the fast-forward reply."""


class OverheadRow(BaseModel):
    prompt: str
    grammar_tokens_per_s: float
    plain_tokens_per_s: float


class Report(BaseModel):
    run: SectionRun
    load_at_start: tuple[float, float, float]
    model: str
    validity: list[ValidityRow]
    latency: list[LatencyRow]
    overhead: list[OverheadRow]


_SCHEMAS = {
    cast(dict[str, Any], tool["function"])["name"]: cast(dict[str, Any], tool["function"])["parameters"]
    for tool in TOOLS
}


def _chat(server: RunningServer, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=REQUEST_TIMEOUT_S)
    response.raise_for_status()
    return cast(dict[str, Any], response.json())


def _body(model: str, prompt: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "tools": list(TOOLS),
        "temperature": 0.0,
        "max_tokens": max_tokens,
        **extra,
    }


def verdict(reply: dict[str, Any]) -> tuple[Verdict, str]:
    """Whether the reply's calls all name an offered tool and validate; "no_call" for a reply without calls."""
    calls = reply["choices"][0]["message"].get("tool_calls") or []
    if not calls:
        return "no_call", ""
    for call in calls:
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        if name not in _SCHEMAS:
            return "invalid", f"unknown tool {name}"
        try:
            jsonschema.validate(json.loads(arguments), _SCHEMAS[name])
        except (ValueError, jsonschema.ValidationError) as error:
            return "invalid", f"{name}: {str(error).splitlines()[0][:120]}"
    return "valid", ""


def _validity(system: str, replies: Sequence[dict[str, Any]]) -> ValidityRow:
    verdicts = [verdict(reply) for reply in replies]
    return ValidityRow(
        system=system,
        valid=sum(v == "valid" for v, _ in verdicts),
        invalid=sum(v == "invalid" for v, _ in verdicts),
        no_call=sum(v == "no_call" for v, _ in verdicts),
        problems=[problem for v, problem in verdicts if v == "invalid"],
    )


def _timed(server: RunningServer, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    reply = _chat(server, body)
    return time.perf_counter() - started, reply


def _decode_rate(server: RunningServer, body: dict[str, Any]) -> float:
    """Completion tokens after the first, over the time after the first streamed piece."""
    first: float | None = None
    last = 0.0
    tokens = 0
    with httpx.stream(
        "POST",
        f"{server.base_url}/v1/chat/completions",
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
        timeout=REQUEST_TIMEOUT_S,
    ) as response:
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            payload = json.loads(line.removeprefix("data: "))
            if payload.get("usage"):
                tokens = payload["usage"]["completion_tokens"]
            if payload.get("choices") and payload["choices"][0]["delta"].get("content"):
                now = time.perf_counter()
                first = first if first is not None else now
                last = now
    if first is None or tokens < 2 or last <= first:
        return 0.0
    return (tokens - 1) / (last - first)


def _calls(reply: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (call["function"]["name"], call["function"]["arguments"])
        for call in reply["choices"][0]["message"].get("tool_calls") or []
    ]


def _latency(
    model_path: Path, work: Path, corpus: Sequence[ToolPrompt], max_tokens: int, prompts: int
) -> list[LatencyRow]:
    """Required calls timed on two exo nodes, with and without grammar fast-forward, taking turns per prompt."""
    model = model_path.name
    with (
        running_exo(model_path, work, name="exo-ff") as forwarded,
        running_exo(model_path, work, ["--no-grammar-fast-forward"], name="exo-no-ff") as stepped,
    ):
        latency: list[LatencyRow] = []
        for item in [prompt for prompt in corpus if prompt in FORCED][:prompts]:
            body = _body(model, item.prompt, max_tokens, tool_choice="required")
            for server in (forwarded, stepped):  # warm both prefix caches alike
                _chat(server, body)
            fast_s, fast = _timed(forwarded, body)
            slow_s, slow = _timed(stepped, body)
            latency.append(
                LatencyRow(
                    prompt=item.prompt,
                    fast_forward_s=fast_s,
                    step_by_step_s=slow_s,
                    same_calls=_calls(fast) == _calls(slow),
                    tokens=fast["usage"]["completion_tokens"],
                )
            )
    return latency


def _validity_and_overhead(
    model_path: Path,
    work: Path,
    corpus: Sequence[ToolPrompt],
    max_tokens: int,
    parts: set[Part],
    *,
    mlx_lm_server: bool,
) -> tuple[list[ValidityRow], list[OverheadRow]]:
    model = model_path.name
    with running_exo(model_path, work) as exo, ExitStack() as stack:
        validity: list[ValidityRow] = []
        if "validity" in parts:
            weights = float32_copy(model_path, work / "float32") if mlx_lm_server else None
            mlx_lm = stack.enter_context(running_mlx_lm_server(weights, work)) if weights is not None else None
            systems: dict[str, list[dict[str, Any]]] = {name: [] for name in _SYSTEMS}
            if mlx_lm is not None:
                systems["mlx_lm.server"] = []
            for number, item in enumerate(corpus, 1):  # systems take turns per prompt, so load falls on all alike
                for name, extra in _SYSTEMS.items():
                    systems[name].append(_chat(exo, _body(model, item.prompt, max_tokens, **extra)))
                if mlx_lm is not None:
                    systems["mlx_lm.server"].append(_chat(mlx_lm, _body(str(weights), item.prompt, max_tokens)))
                verdicts = ", ".join(f"{name}: {verdict(replies[-1])[0]}" for name, replies in systems.items())
                print(f"[{number}/{len(corpus)}] {verdicts}", file=sys.stderr, flush=True)
            validity = [_validity(name, replies) for name, replies in systems.items()]
        overhead = [
            OverheadRow(
                prompt=prompt,
                grammar_tokens_per_s=_decode_rate(exo, _body(model, prompt, 64, auto_tool_grammar=True)),
                plain_tokens_per_s=_decode_rate(
                    exo, _body(model, prompt, 64, auto_tool_grammar=False, tool_call_repair=False)
                ),
            )
            for prompt in (PROSE if "overhead" in parts else [])
        ]
    return validity, overhead


def run(
    model_path: Path,
    corpus: Sequence[ToolPrompt],
    max_tokens: int,
    latency_prompts: int,
    parts: set[Part],
    *,
    command: Sequence[str],
    mlx_lm_server: bool,
) -> Report:
    load_at_start = os.getloadavg()
    validity: list[ValidityRow] = []
    overhead: list[OverheadRow] = []
    latency: list[LatencyRow] = []
    with tempfile.TemporaryDirectory(prefix="bench-tool-calls-") as scratch:
        work = Path(scratch)
        if parts & {"validity", "overhead"}:
            validity, overhead = _validity_and_overhead(
                model_path, work, corpus, max_tokens, parts, mlx_lm_server=mlx_lm_server
            )
        if "latency" in parts and latency_prompts:
            latency = _latency(model_path, work, corpus, max_tokens, latency_prompts)
    return Report(
        run=section_run(command, program="uv run python -m bench.tool_calls_auto"),
        load_at_start=load_at_start,
        model=model_path.name,
        validity=validity,
        latency=latency,
        overhead=overhead,
    )


def markdown(report: Report, corpus_size: int) -> str:
    run = report.run
    lines = [
        f"Commit {run.exo_commit}, {run.cpu}, model {report.model}, finished {run.finished_utc}; load average "
        f"{_load(report.load_at_start)} at the start, {_load(run.load_average)} at the end; greedy. Command: "
        f"`{without_directories(run.command)}`.",
    ]
    if report.validity:
        lines += [
            "",
            f'Schema-valid calls under `tool_choice: "auto"` over {corpus_size} corpus prompts:',
            "",
            "| System | valid calls | invalid calls | no call |",
            "|---|---|---|---|",
        ]
        lines += [f"| {row.system} | {row.valid} | {row.invalid} | {row.no_call} |" for row in report.validity]
    if report.latency:
        ratios = [row.step_by_step_s / row.fast_forward_s for row in report.latency]
        same = sum(row.same_calls for row in report.latency)
        lines += [
            "",
            f"Required calls to tools with ≥ 4 fields ({len(report.latency)} prompts): median "
            f"{statistics.median(row.fast_forward_s for row in report.latency):.2f} s with fast-forward, "
            f"{statistics.median(row.step_by_step_s for row in report.latency):.2f} s without; median speed-up "
            f"{statistics.median(ratios):.2f}× (range {min(ratios):.2f}–{max(ratios):.2f}); same calls {same}/"
            f"{len(report.latency)}; median completion tokens "
            f"{statistics.median(row.tokens for row in report.latency):.0f}.",
        ]
    rates = [row for row in report.overhead if row.plain_tokens_per_s and row.grammar_tokens_per_s]
    if rates:
        ratio = statistics.median(row.grammar_tokens_per_s / row.plain_tokens_per_s for row in rates)
        lines += [
            "",
            f"Replies without calls ({len(rates)} prompts, tools offered): median decode speed with the lazy grammar "
            f"{ratio:.3f}× the speed without.",
        ]
    return "\n".join(lines)


def _load(average: tuple[float, float, float]) -> str:
    return " / ".join(f"{value:.1f}" for value in average)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--limit", type=int, help="only the first N corpus prompts (a quick look)")
    # Room for the corpus's longest call (nested objects and arrays); at 64 such calls were cut mid-arguments.
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--latency-prompts", type=int, default=len(FORCED), help="required calls timed per system")
    parser.add_argument("--no-mlx-lm", action="store_true", help="leave mlx_lm.server out of the validity table")
    parser.add_argument("--only", action="append", choices=PARTS, help="run only this part (repeatable)")
    command = list(sys.argv[1:] if argv is None else argv)
    arguments = parser.parse_args(command)
    corpus = CORPUS[: arguments.limit] if arguments.limit else CORPUS
    report = run(
        arguments.model.expanduser(),
        corpus,
        arguments.max_tokens,
        arguments.latency_prompts,
        set(cast(list[Part], arguments.only) or PARTS),
        command=command,
        mlx_lm_server=not arguments.no_mlx_lm,
    )
    if arguments.out:
        arguments.out.write_text(report.model_dump_json(indent=2))
    print(markdown(report, len(corpus)))


if __name__ == "__main__":
    record_start_commit()  # the commit as the run starts (bench/machine.py)
    main()
