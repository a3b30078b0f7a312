"""int8, Q8_0 or the GGUF's own blocks against float32 weights on a CPU (`--cpu-weights`, issue 33): greedy
agreement, tool calls, speed, memory.

Each format is loaded the way a runner loads it (exo's `load_model` under `CpuKernels`), in a process of its own
with the BLAS the node preloads. The float32 process decodes every corpus prompt greedily; the compared process
(`--compare int8`, the default, `q8_0` or `gguf`) reads those tokens back in one forward pass per prompt and counts the
positions where its top-1 token is the same (teacher-forced top-1 agreement), and decodes the tool prompts itself to
compare the calls (the JSON objects in the text; the default model writes them bare or between tags; each tool
prompt is offered only the tool it is about, to keep its prompt short). Speed: a 512-token prefill pass, then 16
greedy decode steps; memory: the process's resident set after loading and its peak.

`uv run python -m bench.cpu_weights [--model SPEC] [--compare int8|q8_0|gguf] [--tool-prompts N] [--tokens N]`
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Literal, cast

from pydantic import BaseModel

from bench.machine import cpu_model, exo_commit, record_start_commit
from bench.tool_corpus import CORPUS, PROSE, TOOLS

Format = Literal["float32", "int8", "q8_0", "gguf"]


class PromptResult(BaseModel):
    prompt: str
    tools: bool
    tokens: list[int]
    text: str
    agreement: int | None = None
    """Positions (of the float32 tokens) where this format's top-1 equals float32's; None in the float32 run."""


class WorkerResult(BaseModel):
    weights: Format
    dtype: str
    load_seconds: float
    resident_gb: float
    peak_resident_gb: float
    prefill_tokens: int
    prefill_tok_s: float
    decode_tok_s: float
    prompts: list[PromptResult]


def _status_gb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024 / 1e9
    return 0.0


def _worker(model_path: Path, weights: Format, tokens: int, tool_prompts: int, reference: Path | None) -> None:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from exo.shared.types.worker.shards import ShardAssignment
    from exo.worker.engines.mlx.cpu.blas_check import set_blas_threads
    from exo.worker.engines.mlx.cpu.engine import CpuKernels
    from exo.worker.engines.mlx.cpu.q8_layers import BLAS_THREADS
    from exo.worker.engines.mlx.model_loader import load_model

    started = time.perf_counter()
    loaded = load_model(model_path, ShardAssignment(), cpu_kernels=CpuKernels("auto", weights=weights))
    load_seconds = time.perf_counter() - started
    if loaded.dtype in ("q8_0", "gguf"):  # as the runner does: the BLAS on one thread beside ggml's products
        set_blas_threads(BLAS_THREADS)
    resident = _status_gb("VmRSS")
    model, tokenizer = loaded.model, loaded.tokenizer

    def render(prompt: str, tool: str | None) -> list[int]:
        messages = [{"role": "user", "content": prompt}]
        offered = [item for item in TOOLS if cast(dict[str, str], item["function"])["name"] == tool]
        text = cast(
            str,
            tokenizer.apply_chat_template(  # pyright: ignore[reportUnknownMemberType]
                messages, tools=offered or None, add_generation_prompt=True, tokenize=False
            ),
        )
        return list(tokenizer.encode(text, add_special_tokens=False))

    def greedy(prompt_ids: list[int], count: int) -> list[int]:
        cache = make_prompt_cache(model)
        logits = model(mx.array([prompt_ids]), cache=cache)
        out: list[int] = []
        for _ in range(count):
            token = int(logits[0, -1].argmax().item())
            if token in tokenizer.eos_token_ids:
                break
            out.append(token)
            logits = model(mx.array([[token]]), cache=cache)
        return out

    # Speed: one 512-token prefill pass, then decode steps.
    long_ids = render(" ".join(PROSE * 12), None)[:512]
    cache = make_prompt_cache(model)
    started = time.perf_counter()
    for start in range(0, len(long_ids), 512):
        mx.eval(model(mx.array([long_ids[start : start + 512]]), cache=cache))
    prefill = time.perf_counter() - started
    steps, token = 16, long_ids[-1]
    started = time.perf_counter()
    for _ in range(steps):
        logits = model(mx.array([[token]]), cache=cache)
        token = int(logits[0, -1].argmax().item())
    decode = time.perf_counter() - started

    _progress(f"{weights}: prefill {len(long_ids) / prefill:.1f} tok/s, decode {steps / decode:.1f} tok/s")
    corpus = [(prompt, None) for prompt in PROSE] + [(item.prompt, item.tool) for item in CORPUS[:tool_prompts]]
    reference_prompts = (
        WorkerResult.model_validate_json(reference.read_text()).prompts if reference is not None else None
    )
    results: list[PromptResult] = []
    for index, (prompt, tool) in enumerate(corpus):
        ids = render(prompt, tool)
        agreement = None
        if reference_prompts is not None:
            expected = reference_prompts[index].tokens
            logits = model(mx.array([ids + expected]), cache=make_prompt_cache(model))
            chosen = logits[0, len(ids) - 1 : len(ids) - 1 + len(expected)].argmax(-1).tolist()
            agreement = sum(int(a == b) for a, b in zip(cast(list[int], chosen), expected, strict=True))
        # The compared format decodes only the tool prompts itself (their calls are compared); its prose is judged
        # by the teacher-forced agreement alone, which costs one forward pass.
        own = greedy(ids, tokens) if reference_prompts is None or tool is not None else []
        results.append(
            PromptResult(
                prompt=prompt, tools=tool is not None, tokens=own, text=tokenizer.decode(own), agreement=agreement
            )
        )
        _progress(f"{weights}: prompt {index + 1}/{len(corpus)}: agreement {agreement}, {tokenizer.decode(own)!r}")
    print(
        WorkerResult(
            weights=weights,
            dtype=loaded.dtype,
            load_seconds=load_seconds,
            resident_gb=resident,
            peak_resident_gb=_status_gb("VmHWM"),
            prefill_tokens=len(long_ids),
            prefill_tok_s=len(long_ids) / prefill,
            decode_tok_s=steps / decode,
            prompts=results,
        ).model_dump_json()
    )


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def tool_calls(text: str) -> list[object]:
    """The JSON objects in a reply, in order (a call written bare, fenced or between <tool_call> tags)."""
    decoder = json.JSONDecoder()
    found: list[object] = []
    position = 0
    while (match := re.compile(r"\{").search(text, position)) is not None:
        try:
            value, end = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            position = match.start() + 1
            continue
        found.append(value)
        position = end
    return found


def _run_worker(model: Path, weights: Format, tokens: int, tool_prompts: int, reference: Path | None) -> WorkerResult:
    from exo.worker.engines.mlx.cpu.blas import blas_environment

    command = [sys.executable, "-m", "bench.cpu_weights", "--worker", weights, "--model-path", str(model)]
    command += ["--tokens", str(tokens), "--tool-prompts", str(tool_prompts)]
    if reference is not None:
        command += ["--reference", str(reference)]
    # Its progress goes to this process's stderr as it comes.
    done = subprocess.run(command, env=blas_environment(os.environ), stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{weights} worker failed (exit {done.returncode})")
    return WorkerResult.model_validate_json(done.stdout.strip().splitlines()[-1])


def main() -> None:
    record_start_commit()
    parser = argparse.ArgumentParser(
        description="int8, Q8_0 or GGUF blocks against float32 weights on a CPU (--cpu-weights)"
    )
    parser.add_argument("--model", default=None, help="a model spec as `exo --model` takes (default: the default)")
    parser.add_argument("--model-path", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker", choices=("float32", "int8", "q8_0", "gguf"), default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--compare", choices=("int8", "q8_0", "gguf"), default="int8", help="the format compared with float32"
    )
    parser.add_argument("--reference", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--tokens", type=int, default=48, help="greedy tokens per corpus prompt")
    parser.add_argument("--tool-prompts", type=int, default=12, help="prompts of the bench's tool corpus")
    arguments = parser.parse_args()
    if arguments.worker is not None:
        _worker(arguments.model_path, arguments.worker, arguments.tokens, arguments.tool_prompts, arguments.reference)
        return
    from exo.models.paths import default_models_dir
    from exo.models.resolve import resolve_model

    model = resolve_model(arguments.model, default_models_dir())
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-cpu-weights-") as scratch:
        reference_file = Path(scratch) / "float32.json"
        float32 = _run_worker(model.path, "float32", arguments.tokens, arguments.tool_prompts, None)
        reference_file.write_text(float32.model_dump_json())
        other = _run_worker(model.path, arguments.compare, arguments.tokens, arguments.tool_prompts, reference_file)
    load_end = os.getloadavg()
    _report(model.model_id, float32, other, load_start, load_end, sys.argv[1:])


def _report(  # noqa: PLR0917 - one call site, the run's figures in order
    model_id: str,
    float32: WorkerResult,
    other: WorkerResult,
    load_start: tuple[float, float, float],
    load_end: tuple[float, float, float],
    arguments: list[str],
) -> None:
    def agreement(tools: bool) -> str:
        pairs = [(f, i) for f, i in zip(float32.prompts, other.prompts, strict=True) if f.tools == tools]
        same = sum(i.agreement or 0 for _, i in pairs)
        total = sum(len(f.tokens) for f, _ in pairs)
        return f"{same}/{total} ({100 * same / max(total, 1):.1f}%)"

    tool_pairs = [(f, i) for f, i in zip(float32.prompts, other.prompts, strict=True) if f.tools]
    same_calls = sum(tool_calls(f.text) == tool_calls(i.text) for f, i in tool_pairs)
    with_calls = sum(bool(tool_calls(f.text)) for f, _ in tool_pairs)
    same_text = sum(f.tokens == i.tokens for f, i in tool_pairs)
    loads = ", ".join(f"{value:.2f}" for value in load_start), ", ".join(f"{value:.2f}" for value in load_end)
    print(
        f"Run: commit {exo_commit()}, {os.cpu_count()} × {cpu_model()}; load average (1, 5, 15 min) {loads[0]} "
        f"at the start, {loads[1]} at the end ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}); command "
        f"`uv run python -m bench.cpu_weights {' '.join(arguments)}`; model {model_id}.\n"
    )
    name = other.weights
    print(f"| Measure | float32 | {name} | {name} ÷ float32 |\n|---|---|---|---|")
    rows = [
        ("load (s)", float32.load_seconds, other.load_seconds),
        ("resident memory after loading (GB)", float32.resident_gb, other.resident_gb),
        ("peak resident memory of the process (GB)", float32.peak_resident_gb, other.peak_resident_gb),
        (f"prefill, a {float32.prefill_tokens}-token prompt (tok/s)", float32.prefill_tok_s, other.prefill_tok_s),
        ("decode, one stream (tok/s)", float32.decode_tok_s, other.decode_tok_s),
    ]
    for measure, left, right in rows:
        print(f"| {measure} | {left:.2f} | {right:.2f} | {right / left:.2f}× |")
    print(
        f"\nTeacher-forced greedy top-1 agreement with float32: prose {agreement(False)}, tool prompts "
        f"{agreement(True)}; tool prompts decoded to identical tokens {same_text}/{len(tool_pairs)}; tool prompts "
        f"whose JSON objects (calls) are the same {same_calls}/{len(tool_pairs)} (float32 wrote some in {with_calls})."
    )


if __name__ == "__main__":
    main()
