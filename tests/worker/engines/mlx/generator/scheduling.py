"""Driving the runner's GenerationScheduler in-process on a fixture model: requests built from OpenAI request bodies
through the real API adapter, run alone or arriving together, their chunks collected per request."""

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import mlx.core as mx
from pydantic import JsonValue

from exo.api.adapters.chat_request import to_command
from exo.api.types.openai_chat import ChatCompletionRequest
from exo.shared.types.chunks import Chunk, ErrorChunk, FinishChunk, PrefillProgressChunk, ToolCallChunk
from exo.shared.types.common import ModelId, TaskId, new_task_id
from exo.shared.types.tasks import GenerationTask
from exo.shared.types.worker.decode_settings import DecodeSettings
from exo.shared.types.worker.shards import ShardAssignment
from exo.tool_calls import detect_tool_format
from exo.worker.engines.mlx.cache.prefix_cache import PrefixCache
from exo.worker.engines.mlx.chat_template import chat_template_text
from exo.worker.engines.mlx.generator.chat_completion import ChatRequest
from exo.worker.engines.mlx.generator.processors import RequestProcessors
from exo.worker.engines.mlx.generator.request_context import EngineContext
from exo.worker.engines.mlx.generator.scheduler import GenerationScheduler
from exo.worker.engines.mlx.loaded_model import LoadedModel
from exo.worker.engines.mlx.model_loader import load_model
from tests.fixtures.fixture_specs import PARIS_WEATHER_RESULT, assistant_tool_call, tool_result, user

MAX_STEPS = 5_000
JsonBody = dict[str, JsonValue]
PARIS_LOOP: list[JsonValue] = [
    user("What is the weather in Paris?"),
    assistant_tool_call("get_weather", {"city": "Paris"}, "call_0"),
    tool_result(PARIS_WEATHER_RESULT, "call_0"),
    assistant_tool_call("get_weather", {"city": "Paris"}, "call_1"),
    tool_result(PARIS_WEATHER_RESULT, "call_1"),
]
"""A real loop: the same call twice in a row with the same result twice, so the guard withdraws a third."""
PUSH = 100.0
"""Far above the fixture's own logits: the pushed text is written wherever the grammar allows it."""


def push_text(loaded: LoadedModel, text: str) -> Callable[[mx.array, mx.array], mx.array]:
    """A model that writes `text` at the start of its reply: the next token of it is pushed while the reply so far
    is a beginning of it."""
    target: list[int] = loaded.tokenizer.encode(text, add_special_tokens=False)
    prompt_length: list[int] = []

    def push(tokens: mx.array, logits: mx.array) -> mx.array:
        if not prompt_length:
            prompt_length.append(tokens.shape[0])
        written: list[int] = tokens[prompt_length[0] :].tolist()  # pyright: ignore[reportAssignmentType] -- 1-D ints
        if len(written) >= len(target) or written != target[: len(written)]:
            return logits
        bias = mx.zeros((logits.shape[-1],), dtype=logits.dtype)
        bias[target[len(written)]] = PUSH
        return logits + bias

    return push


def engine_context(model_path: Path, settings: DecodeSettings, *, prefix_cache_bytes: int = 0) -> EngineContext:
    """What the runner builds after loading `model_path` (without a prefix cache unless a budget is given)."""
    loaded = load_model(model_path, ShardAssignment())
    return context_for(loaded, settings, prefix_cache_bytes=prefix_cache_bytes)


def context_for(loaded: LoadedModel, settings: DecodeSettings, *, prefix_cache_bytes: int = 0) -> EngineContext:
    tool_format = detect_tool_format(chat_template_text(loaded.tokenizer))
    prefix_cache = PrefixCache(loaded.model, prefix_cache_bytes) if prefix_cache_bytes else None
    return EngineContext(loaded=loaded, tool_format=tool_format, prefix_cache=prefix_cache, decode=settings)


def with_settings(context: EngineContext, settings: DecodeSettings) -> EngineContext:
    """The same loaded model and prefix cache, decoded with other settings."""
    return replace(context, decode=settings)


def task(body: Mapping[str, JsonValue]) -> GenerationTask:
    """A runner task for an OpenAI chat request body, validated by the API's own adapter."""
    command = to_command(ChatCompletionRequest.model_validate({"model": "fixture", **body}), ModelId("fixture"))
    return GenerationTask(
        task_id=new_task_id(), command_id=command.command_id, model_id=command.model_id, params=command.params
    )


@dataclass
class Outcome:
    chunks: list[Chunk]

    @property
    def last(self) -> Chunk:
        return self.chunks[-1]

    def normalised(self) -> list[str]:
        """The chunks as JSON, with random tool-call ids and cache-dependent usage blanked, without the prefill
        progress (its pieces are sized by the time they take)."""
        lines: list[str] = []
        for chunk in self.chunks:
            shown = chunk
            if isinstance(chunk, ToolCallChunk):
                shown = chunk.model_copy(update={"call_id": "call"})
            if isinstance(chunk, FinishChunk):
                blanked = chunk.usage.model_copy(update={"cached_tokens": 0, "disk_cached_tokens": 0})
                shown = chunk.model_copy(update={"usage": blanked})
            if isinstance(chunk, PrefillProgressChunk):
                continue
            lines.append(shown.model_dump_json())
        return lines

    @property
    def text(self) -> str:
        return "".join(str(json.loads(line).get("text", "")) for line in self.normalised())


def run(
    context: EngineContext,
    arrivals: Mapping[int, Sequence[GenerationTask]],
    *,
    cancel_at: Mapping[int, Sequence[TaskId]] | None = None,
    scheduler: GenerationScheduler | None = None,
    processors: Mapping[TaskId, RequestProcessors] | None = None,
    rewinds: bool = False,
) -> dict[TaskId, Outcome]:
    """Step a scheduler until every task ended; `arrivals[n]` are admitted before step n, `cancel_at[n]` cancelled.

    A cancelled task's outcome holds the chunks it got before the cancel. `processors` replace a task's own.
    `rewinds`: requests are opened as the runner opens them, able to repair a failed call.
    """
    scheduler = scheduler or GenerationScheduler(context.loaded.model, context.decode)
    outcomes: dict[TaskId, Outcome] = {}
    pending = dict(arrivals)
    cancels = dict(cancel_at or {})
    for step in range(MAX_STEPS):
        for arriving in pending.pop(step, ()):
            outcomes[arriving.task_id] = Outcome([])
            request = ChatRequest.open(context, arriving, rewinds=rewinds)
            if processors and arriving.task_id in processors:
                request.processors = processors[arriving.task_id]
            scheduler.admit(request)
        for task_id in cancels.pop(step, ()):
            assert scheduler.cancel(task_id) is not None
        for update in scheduler.step():
            outcomes[update.task_id].chunks += update.chunks
        if not pending and not cancels and scheduler.active == 0:
            return outcomes
    raise AssertionError(f"still running after {MAX_STEPS} steps")


def run_alone(context: EngineContext, one: GenerationTask, *, rewinds: bool = False) -> Outcome:
    return run(context, {0: [one]}, rewinds=rewinds)[one.task_id]


def assert_ended(outcome: Outcome) -> FinishChunk:
    assert isinstance(outcome.last, FinishChunk), outcome.chunks
    assert not any(isinstance(chunk, ErrorChunk) for chunk in outcome.chunks)
    return outcome.last
