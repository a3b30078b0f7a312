"""`python -m bench.compiled_blocks MODEL_DIR`: a decode step with and without compiled blocks, by part (issue 36).

In-process, on the runner's `GenerationScheduler` (no node, no HTTP, so no other process shares the cores), with the
runner's BLAS preloaded: the model is loaded twice, with its decoder layers' compiled parts
(`compiled_blocks.py`) and with `EXO_COMPILED_BLOCKS=off`, and the two take turns, round by round, each round N
greedy 64-token streams admitted together. Every step in which all N decode is metered by the host-overhead meter's
parts (graph: building the pass in Python; launch: `mx.async_eval`; device: waiting on the model; the loop's own
work is the rest). MODEL_DIR is best the CPU stand-in (`bench.random_model`; docs/PERFORMANCE.md names the shape).
Prints the medians as JSON and as a table.
"""

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from bench.host_overhead import TOPICS
from bench.worker_process import with_runners_blas

if TYPE_CHECKING:
    from exo.worker.engines.mlx.generator.request_context import EngineContext

PARTS = ("graph", "launch", "device")


class SettingLevel(BaseModel):
    compiled: bool
    compiled_layers: int
    """Decoder layers that ran compiled parts (0 where they do not fit the model, or when off)."""
    streams: int
    steps: int
    step_ms: float
    parts_ms: dict[str, float]
    """Medians by part; "loop" is the step less every part."""


class CompiledBlocksReport(BaseModel):
    model: str
    rounds: int
    levels: list[SettingLevel]
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.compiled_blocks", description=__doc__)
    parser.add_argument("model", type=Path)
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    arguments = parser.parse_args()
    with_runners_blas("bench.compiled_blocks", sys.argv[1:])
    report = measure(arguments.model, arguments.streams, arguments.rounds, arguments.max_tokens)
    print(report.model_dump_json(indent=1))
    print("| Compiled blocks (layers) | Streams | Steps | Step ms | graph | launch | device | loop |")
    print("|---|---|---|---|---|---|---|---|")
    for level in report.levels:
        parts = " | ".join(f"{level.parts_ms[name]:.3f}" for name in (*PARTS, "loop"))
        setting = f"on ({level.compiled_layers})" if level.compiled else "off"
        print(f"| {setting} | {level.streams} | {level.steps} | {level.step_ms:.2f} | {parts} |")


def measure(model_dir: Path, levels: list[int], rounds: int, max_tokens: int) -> CompiledBlocksReport:
    from exo.shared.types.worker.decode_settings import DecodeSettings
    from exo.shared.types.worker.shards import ShardAssignment
    from exo.tool_calls import detect_tool_format
    from exo.worker.engines.mlx.chat_template import chat_template_text
    from exo.worker.engines.mlx.compiled_blocks import COMPILED_BLOCKS_VARIABLE, compiled_layers
    from exo.worker.engines.mlx.generator.request_context import EngineContext
    from exo.worker.engines.mlx.model_loader import load_model

    contexts: dict[bool, EngineContext] = {}
    chosen = os.environ.pop(COMPILED_BLOCKS_VARIABLE, None)
    for compiled in (True, False):
        if not compiled:
            os.environ[COMPILED_BLOCKS_VARIABLE] = "off"
        loaded = load_model(model_dir, ShardAssignment())
        tool_format = detect_tool_format(chat_template_text(loaded.tokenizer))
        settings = DecodeSettings(batch_size=max(levels))
        contexts[compiled] = EngineContext(loaded=loaded, tool_format=tool_format, prefix_cache=None, decode=settings)
    os.environ.pop(COMPILED_BLOCKS_VARIABLE, None)
    if chosen is not None:
        os.environ[COMPILED_BLOCKS_VARIABLE] = chosen
    load_before = os.getloadavg()
    for context in contexts.values():
        for streams in levels:
            _round(context, streams, max_tokens)  # first passes of each shape, not counted
    measured: dict[tuple[bool, int], list[tuple[float, dict[str, float]]]] = {}
    for _ in range(rounds):
        for compiled, context in contexts.items():
            for streams in levels:
                measured.setdefault((compiled, streams), []).extend(_round(context, streams, max_tokens))
    return CompiledBlocksReport(
        model=str(model_dir),
        rounds=rounds,
        levels=[
            _level(compiled, compiled_layers(contexts[compiled].loaded.model), streams, steps)
            for (compiled, streams), steps in measured.items()
        ],
        load_before=load_before,
        load_after=os.getloadavg(),
    )


def _round(context: "EngineContext", streams: int, max_tokens: int) -> list[tuple[float, dict[str, float]]]:
    """One round on a fresh scheduler: each step in which all `streams` decode, as (seconds, seconds by part)."""
    from bench.runner_tasks import generation_task
    from exo.worker.engines.mlx.generator.chat_completion import ChatRequest
    from exo.worker.engines.mlx.generator.scheduler import GenerationScheduler
    from exo.worker.engines.mlx.step_clock import STEP_CLOCK

    scheduler = GenerationScheduler(context.loaded.model, context.decode)
    for index in range(streams):
        body = {
            "messages": [{"role": "user", "content": f"Write a long story about {TOPICS[index % len(TOPICS)]}."}],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        scheduler.admit(ChatRequest.open(context, generation_task(body, "standin")))
    steps: list[tuple[float, dict[str, float]]] = []
    while scheduler.active:
        STEP_CLOCK.begin()
        scheduler.step()
        seconds, parts = STEP_CLOCK.end()
        if scheduler.decoding == streams and not parts.get("prefill"):
            steps.append((seconds, {name: value for name, value in parts.items() if name != "beside"}))
    return steps


def _level(compiled: bool, layers: int, streams: int, steps: list[tuple[float, dict[str, float]]]) -> SettingLevel:
    def median_ms(values: list[float]) -> float:
        return round(statistics.median(values) * 1000, 3)

    parts = {name: median_ms([by_part.get(name, 0.0) for _, by_part in steps]) for name in PARTS}
    parts["loop"] = median_ms([seconds - sum(by_part.values()) for seconds, by_part in steps])
    return SettingLevel(
        compiled=compiled,
        compiled_layers=layers,
        streams=streams,
        steps=len(steps),
        step_ms=median_ms([seconds for seconds, _ in steps]),
        parts_ms=parts,
    )


if __name__ == "__main__":
    main()
