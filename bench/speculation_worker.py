"""Prompt-lookup speculation measured in its own process: `python -m bench.speculation_worker SETUP_JSON`.

The parent starts it with exo's runner environment (`blas_environment`). It loads the model as exo's runner does
and decodes each workload with the runner's own `ChatRequest` and `GenerationScheduler` (what a lone request goes
through), in three modes taking turns run by run: speculation off, on as shipped (a draft is verified where the
measured step costs say it pays) and verifying every draft. Prints one `SpeculationReport` JSON line on stdout.

All modes share one prefix cache, as requests to one runner do: a workload's prompt is prefilled once, and decode
speed excludes the first token anyway.
"""

import json
import os
import sys
import time
from pathlib import Path
from statistics import median
from typing import cast

from pydantic import BaseModel

from bench.machine import exo_commit
from bench.results import SpeculationReport, SpeculationRow, SpeculationSettings
from bench.runner_tasks import generation_task
from bench.stream_client import request_body
from bench.workloads import decode_messages, edit_messages, rewrite_messages
from exo.api.types.openai_chat import ToolDefinition
from exo.shared.types.chunks import FinishChunk, TokenChunk, ToolCallArgumentsChunk, ToolCallChunk
from exo.shared.types.common import new_task_id
from exo.shared.types.tasks import GenerationTask
from exo.shared.types.worker.decode_settings import DecodeSettings, LookupSettings
from exo.shared.types.worker.shards import ShardAssignment
from exo.tool_calls import detect_tool_format
from exo.worker.engines.mlx.cache.prefix_cache import PrefixCache
from exo.worker.engines.mlx.chat_template import chat_template_text
from exo.worker.engines.mlx.cpu.matmul_planner import MatmulPlanner
from exo.worker.engines.mlx.generator.chat_completion import ChatRequest
from exo.worker.engines.mlx.generator.request_context import EngineContext
from exo.worker.engines.mlx.generator.scheduler import GenerationScheduler
from exo.worker.engines.mlx.model_loader import load_model

OFF = "off"
MODES: dict[str, LookupSettings | None] = {
    OFF: None,
    "on (default)": LookupSettings(),
    "every draft verified": LookupSettings(adaptive=False),
}
EDIT = "opencode edit"
REWRITE = "file rewrite"
FREE_TEXT = "free text"
PREFIX_CACHE_BYTES = 2 * 1024**3


class SpeculationSetup(BaseModel):
    model_path: Path
    tools_path: Path
    settings: SpeculationSettings


class _Run(BaseModel):
    tokens: list[int]
    text: str
    """The reply as a client reads it: content, then each call's name and arguments."""
    prompt_tokens: int
    tokens_per_s: float
    drafted: int
    accepted: int
    forward_passes: int


def _tasks(tools_path: Path, settings: SpeculationSettings) -> dict[str, GenerationTask]:
    entries = cast(list[object], json.loads(tools_path.read_text()))
    tools = [ToolDefinition.model_validate(entry) for entry in entries]
    wanted = settings.edit_tools
    offered = tools if wanted is None else [tool for tool in tools if tool.function.name in wanted]
    bodies = {
        EDIT: request_body(edit_messages(), offered, settings.max_tokens),
        REWRITE: request_body(rewrite_messages(), [], settings.max_tokens),
        FREE_TEXT: request_body(decode_messages("speculation"), [], settings.max_tokens),
    }
    tasks: dict[str, GenerationTask] = {}
    for workload, body in bodies.items():
        tasks[workload] = generation_task(body, "bench")
    return tasks


def _decode(context: EngineContext, scheduler: GenerationScheduler, task: GenerationTask) -> _Run:
    """One request through the scheduler alone; decode speed from the times its tokens came out."""
    request = ChatRequest.open(context, task.model_copy(update={"task_id": new_task_id()}))
    before = (scheduler.speculation.drafted, scheduler.speculation.accepted, scheduler.speculation.steps)
    scheduler.admit(request)
    stamps: list[tuple[float, int]] = []
    text: list[str] = []
    prompt_tokens = 0
    while scheduler.active:
        for update in scheduler.step():
            stamps.append((time.perf_counter(), update.generated_tokens))
            for chunk in update.chunks:
                match chunk:
                    case TokenChunk(text=piece) | ToolCallArgumentsChunk(fragment=piece):
                        text.append(piece)
                    case ToolCallChunk(name=name):
                        text.append(f"\n[call {name}] ")
                    case FinishChunk(usage=usage):
                        prompt_tokens = usage.prompt_tokens
                    case _:
                        pass
    first = next(at for at, generated in stamps if generated > 0)
    last = max(at for at, generated in stamps if generated == len(request.generated))
    tokens = len(request.generated)
    return _Run(
        tokens=request.generated,
        text="".join(text),
        prompt_tokens=prompt_tokens,
        tokens_per_s=(tokens - 1) / (last - first) if tokens > 1 and last > first else 0.0,
        drafted=scheduler.speculation.drafted - before[0],
        accepted=scheduler.speculation.accepted - before[1],
        forward_passes=scheduler.speculation.steps - before[2],
    )


def measure(setup: SpeculationSetup) -> SpeculationReport:
    loaded = load_model(setup.model_path, ShardAssignment())
    if (planner := MatmulPlanner.for_loaded(loaded)) is not None:
        planner.finish()  # as exo's runner does while idle, before the bench measures it
    tool_format = detect_tool_format(chat_template_text(loaded.tokenizer))
    prefix_cache = PrefixCache(loaded.model, PREFIX_CACHE_BYTES)
    contexts = {
        mode: EngineContext(
            loaded=loaded, tool_format=tool_format, prefix_cache=prefix_cache, decode=DecodeSettings(speculation=lookup)
        )
        for mode, lookup in MODES.items()
    }
    # One scheduler per mode for the whole section, as one runner serves request after request: the step costs the
    # default mode measures carry over from run to run.
    schedulers = {mode: GenerationScheduler(loaded.model, context.decode) for mode, context in contexts.items()}
    tasks = _tasks(setup.tools_path, setup.settings)
    runs: dict[tuple[str, str], list[_Run]] = {}
    order = list(MODES)
    for repeat in range(setup.settings.repeats):
        for workload, task in tasks.items():
            for mode in order[repeat % len(order) :] + order[: repeat % len(order)]:
                run = _decode(contexts[mode], schedulers[mode], task)
                runs.setdefault((workload, mode), []).append(run)
                sys.stderr.write(f"[speculation] {workload} / {mode}: {run.tokens_per_s:.2f} tok/s\n")
    rows: list[SpeculationRow] = []
    for (workload, mode), measured in runs.items():
        reference = runs[(workload, OFF)][0].tokens
        rows.append(
            SpeculationRow(
                workload=workload,
                mode=mode,
                tokens_per_s=[run.tokens_per_s for run in measured],
                median_tokens_per_s=median(run.tokens_per_s for run in measured),
                completion_tokens=len(measured[0].tokens),
                drafted=sum(run.drafted for run in measured),
                accepted=sum(run.accepted for run in measured),
                forward_passes=sum(run.forward_passes for run in measured),
                same_tokens_as_off=all(run.tokens == reference for run in measured),
                text=measured[0].text[:400],
            )
        )
    costs = schedulers["on (default)"].step_costs.measured()
    plain = costs.get(1)
    return SpeculationReport(
        settings=setup.settings,
        pass_cost_ratios={fed: seconds / plain for fed, seconds in costs.items()} if plain else {},
        prompt_tokens={workload: runs[(workload, OFF)][0].prompt_tokens for workload in tasks},
        rows=rows,
        load_average=os.getloadavg(),
        exo_commit=exo_commit(),
    )


def main() -> None:
    setup = SpeculationSetup.model_validate_json(sys.argv[1])
    sys.stdout.write(measure(setup).model_dump_json() + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
