"""The real FastAPI app and master in process, with a scripted worker instead of runner subprocesses.

Everything up to the worker boundary is the production code (guard middleware, validation, adapters, master
placement, SSE encoding); only generation is replaced, so API behaviour is tested in milliseconds.
"""

from collections.abc import Mapping
from typing import Any, Protocol

from anyio import create_memory_object_stream
from anyio.streams.memory import MemoryObjectReceiveStream
from fastapi import FastAPI

from exo.master.api import create_app
from exo.node import Node, NodeConfig
from exo.shared.types.chunks import Chunk, FinishChunk, TokenChunk, Usage
from exo.shared.types.common import ModelId, RunnerId, TaskId
from exo.shared.types.events import RunnerUpdated
from exo.shared.types.state import RunnerInfo
from exo.shared.types.tasks import ChatCompletionTask
from exo.shared.types.worker.runner_response import ModelMetadata
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.main import Worker

SCRIPTED_MODEL = ModelId("scripted-model")
SCRIPTED_REPLY = "scripted reply"


class ResponseLike(Protocol):
    """What response assertions read; httpx's and the TestClient's responses (a vendored httpx) both have it."""

    @property
    def status_code(self) -> int: ...
    @property
    def text(self) -> str: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    def json(self) -> Any: ...


SCRIPTED_CHUNKS: tuple[Chunk, ...] = (
    TokenChunk(text=SCRIPTED_REPLY),
    FinishChunk(finish_reason="stop", usage=Usage(prompt_tokens=3, completion_tokens=2)),
)


class ScriptedWorker(Worker):
    """Answers every task with `script` (SCRIPTED_REPLY unless a test sets another) and records what it was given."""

    def __init__(self) -> None:  # pyright: ignore[reportMissingSuperCall] - no task group: nothing runs
        self.tasks: list[ChatCompletionTask] = []
        self.script: tuple[Chunk, ...] = SCRIPTED_CHUNKS

    def submit(self, runner_id: RunnerId, task: ChatCompletionTask) -> MemoryObjectReceiveStream[Chunk]:  # noqa: ARG002 - one runner
        self.tasks.append(task)
        sender, receiver = create_memory_object_stream[Chunk](len(self.script))
        for chunk in self.script:
            sender.send_nowait(chunk)
        sender.close()
        return receiver

    def cancel(self, runner_id: RunnerId, task_id: TaskId) -> None:
        pass


def scripted_app(
    config: NodeConfig | None = None, worker: ScriptedWorker | None = None
) -> tuple[FastAPI, ScriptedWorker]:
    """The production app for a node serving SCRIPTED_MODEL through a ScriptedWorker (or `worker`)."""
    node = Node(config or NodeConfig())
    worker = worker or ScriptedWorker()
    node.master.attach_worker(worker)
    node.master.on_event(
        RunnerUpdated(
            runner=RunnerInfo(
                runner_id=RunnerId("runner-scripted"),
                model_id=SCRIPTED_MODEL,
                model_path="/nonexistent/scripted-model",
                shard=ShardAssignment(),
                status="ready",
                metadata=ModelMetadata(
                    context_length=4096,
                    tool_format="hermes",
                    supports_reasoning=False,
                    dtype="float32",
                    vocab_size=741,
                ),
            )
        )
    )
    return create_app(node), worker
