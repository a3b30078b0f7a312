"""`python -m bench.join_step MODEL_DIR`: what the batch step in which a constrained request joins costs (issue 36).

In-process, on the runner's `GenerationScheduler` (no node, no HTTP): per round, `--running` requests under a strict
JSON schema decode in the batch, then one more under the same schema arrives; the batch step in which it joins (its
first token sampled beside the running members' step) is timed, and so are the batch steps before it. With overlap
on, the newcomer's first forward pass is launched before its first grammar mask, which is computed while the pass
runs; `--no-overlap` keeps the serial order. MODEL_DIR is best the CPU stand-in (`bench.random_model`, a few
milliseconds a step; docs/PERFORMANCE.md names the shape). The first round (llguidance's tokenizer built) is not
counted. Prints one JSON line.
"""

import argparse
import statistics
from pathlib import Path
from typing import cast

from pydantic import BaseModel

from bench.host_overhead import STORY_FORMAT, TOPICS
from bench.runner_tasks import generation_task
from exo.shared.types.tasks import GenerationTask
from exo.shared.types.worker.decode_settings import DecodeSettings
from exo.shared.types.worker.shards import ShardAssignment
from exo.tool_calls import detect_tool_format
from exo.worker.engines.mlx.chat_template import chat_template_text
from exo.worker.engines.mlx.generator.chat_completion import ChatRequest
from exo.worker.engines.mlx.generator.request_context import EngineContext
from exo.worker.engines.mlx.generator.scheduler import GenerationScheduler
from exo.worker.engines.mlx.loaded_model import LoadedModel
from exo.worker.engines.mlx.model_loader import load_model
from exo.worker.engines.mlx.step_clock import STEP_CLOCK, StepPart

STEADY_STEPS = 5
"""Batch steps timed before the newcomer arrives."""


class JoinStepReport(BaseModel):
    overlap: bool
    rounds: int
    join_ms: list[float]
    """Per round, the batch step in which the newcomer joined."""
    steady_ms: list[float]
    """Per round, the median of the batch steps before it arrived."""
    join_parts_ms: list[dict[str, float]]
    """Per round, the join step's time by part (the host-overhead meter's parts: "device" is the wait on the model;
    the rest of the step is in no part)."""
    steady_parts_ms: list[dict[str, float]]
    """Per round, the last step before the newcomer arrived, by part."""
    constrained_joins: int
    """Joins whose first pass was launched before the newcomer's first mask (0 with overlap off)."""


def _task(topic: str, max_tokens: int) -> GenerationTask:
    body = {
        "messages": [{"role": "user", "content": f"Write a very short story about {topic}."}],
        "max_tokens": max_tokens,
        "response_format": STORY_FORMAT,
    }
    return generation_task(body, "standin")


def _round(
    context: EngineContext, running: int, max_tokens: int
) -> tuple[float, float, dict[str, float], dict[str, float], int]:
    """One round on a fresh scheduler: (join step ms, median steady step ms, the join step's and the last steady
    step's ms by part, constrained joins)."""
    scheduler = GenerationScheduler(context.loaded.model, context.decode)
    for index in range(running):
        scheduler.admit(ChatRequest.open(context, _task(TOPICS[index % len(TOPICS)], max_tokens)))
    while scheduler.decoding < running or scheduler.active > scheduler.decoding:
        scheduler.step()
    steady: list[float] = []
    steady_parts: dict[StepPart, float] = {}
    for _ in range(STEADY_STEPS):
        STEP_CLOCK.begin()
        scheduler.step()
        seconds, steady_parts = STEP_CLOCK.end()
        steady.append(seconds)
    newcomer = _task("a newcomer", max_tokens)
    scheduler.admit(ChatRequest.open(context, newcomer))
    # Its prompt is read in prefill steps first; the step it joins in is timed without that step's prefill piece.
    joined: list[tuple[float, dict[StepPart, float]]] = []
    batch_step = scheduler._batch_step  # pyright: ignore[reportPrivateUsage]

    def timed() -> list[object]:
        STEP_CLOCK.begin()
        updates = batch_step()
        if any(update.task_id == newcomer.task_id and update.generated_tokens > 0 for update in updates):
            joined.append(STEP_CLOCK.end())
        return list(updates)

    scheduler._batch_step = timed  # pyright: ignore[reportAttributeAccessIssue,reportPrivateUsage]
    while not joined:
        if scheduler.active == 0:
            raise RuntimeError("the running requests ended before the newcomer joined: raise --max-tokens")
        scheduler.step()
    # Absent before the join was overlapped (bench run against older code for a before/after pair): none then.
    joins = cast(int, getattr(scheduler, "batch_grammar_joins", 0))
    seconds, parts = joined[0]
    return seconds * 1000, statistics.median(steady) * 1000, _ms(parts), _ms(steady_parts), joins


def _ms(parts: dict[StepPart, float]) -> dict[str, float]:
    return {part: round(seconds * 1000, 3) for part, seconds in parts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model", type=Path)
    parser.add_argument("--running", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--no-overlap", action="store_true")
    arguments = parser.parse_args()
    loaded: LoadedModel = load_model(arguments.model, ShardAssignment())
    settings = DecodeSettings(batch_size=8, speculation=None, overlap=not arguments.no_overlap)
    tool_format = detect_tool_format(chat_template_text(loaded.tokenizer))
    context = EngineContext(loaded=loaded, tool_format=tool_format, prefix_cache=None, decode=settings)
    _round(context, arguments.running, arguments.max_tokens)  # llguidance's tokenizer, first passes
    results = [_round(context, arguments.running, arguments.max_tokens) for _ in range(arguments.rounds)]
    report = JoinStepReport(
        overlap=settings.overlap,
        rounds=arguments.rounds,
        join_ms=[round(result[0], 3) for result in results],
        steady_ms=[round(result[1], 3) for result in results],
        join_parts_ms=[result[2] for result in results],
        steady_parts_ms=[result[3] for result in results],
        constrained_joins=sum(result[4] for result in results),
    )
    print(report.model_dump_json())


if __name__ == "__main__":
    main()
