"""Tasks and a supervisor for tests that drive a real runner subprocess without the API in front of it."""

from collections.abc import AsyncGenerator, Callable
from contextlib import asynccontextmanager

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from exo.shared.types.chunks import Chunk
from exo.shared.types.common import ModelId, new_command_id, new_runner_id, new_task_id
from exo.shared.types.tasks import GenerationParams, GenerationTask, PromptMessage, SamplingParams
from exo.shared.types.worker.decode_settings import DecodeSettings
from exo.worker.runner.runner_config import RunnerConfig
from exo.worker.runner.supervisor import RunnerSupervisor
from tests.exo_server import fixture_model

MODEL = ModelId("tiny-qwen-tools")


def chat_task(content: str = "Hello!", max_tokens: int = 32) -> GenerationTask:
    """A greedy completion of one user message on the tiny fixture model."""
    return GenerationTask(
        task_id=new_task_id(),
        command_id=new_command_id(),
        model_id=MODEL,
        params=GenerationParams(
            messages=(PromptMessage(role="user", content=content),), sampling=SamplingParams(max_tokens=max_tokens)
        ),
    )


AGENT_SYSTEM_PROMPT = "You are a careful coding agent. Follow the rules of the repository. " * 30
"""Long enough (over a thousand of the fixture's tokens) for the prefix cache to snapshot it to disk."""


def session_task(question: str, max_tokens: int = 24) -> GenerationTask:
    """A new agent session's first request: the agent's long system prompt, then the user's question."""
    messages = (
        PromptMessage(role="system", content=AGENT_SYSTEM_PROMPT),
        PromptMessage(role="user", content=question),
    )
    return GenerationTask(
        task_id=new_task_id(),
        command_id=new_command_id(),
        model_id=MODEL,
        params=GenerationParams(messages=messages, sampling=SamplingParams(max_tokens=max_tokens)),
    )


async def collect(stream: MemoryObjectReceiveStream[Chunk]) -> list[Chunk]:
    """Every chunk of one task, until the supervisor closes its stream."""
    async with stream:
        return [chunk async for chunk in stream]


async def until_ready(supervisor: RunnerSupervisor) -> None:
    """Wait until the runner reports its model loaded, as /state would show it."""
    while supervisor.status != "ready":
        await anyio.sleep(0.05)


@asynccontextmanager
async def running_supervisor(
    batch_size: int = 8,
    config: RunnerConfig | None = None,
    on_change: Callable[[RunnerSupervisor], None] = lambda _: None,
) -> AsyncGenerator[RunnerSupervisor]:
    """A RunnerSupervisor with a real runner subprocess serving tiny-qwen-tools (or as `config` says), ready to take
    tasks; `on_change` is called with it whenever it reports a change (as the worker is)."""
    config = config or RunnerConfig(
        model_id=MODEL, model_path=fixture_model(MODEL), decode=DecodeSettings(batch_size=batch_size)
    )
    supervisor = RunnerSupervisor(new_runner_id(), config, on_change=lambda: on_change(supervisor))
    async with anyio.create_task_group() as group:
        group.start_soon(supervisor.run)
        with anyio.fail_after(120):
            await until_ready(supervisor)
        try:
            yield supervisor
        finally:
            await supervisor.stop()
            group.cancel_scope.cancel()
