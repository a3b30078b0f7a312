"""The master: applies events to the node state and turns commands into tasks placed on runners."""

import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from exo.master.state import apply, place_task
from exo.shared.errors import ModelNotLoadedError
from exo.shared.types.chunks import Chunk
from exo.shared.types.commands import CancelTaskCommand, ChatCompletionCommand
from exo.shared.types.common import ModelId, RunnerId, TaskId, new_task_id
from exo.shared.types.events import Event, NodeJoined
from exo.shared.types.state import NodeInfo, State
from exo.shared.types.tasks import ChatCompletionTask
from exo.worker.main import Worker

logger = logging.getLogger(__name__)


@dataclass
class TaskHandle:
    task_id: TaskId
    runner_id: RunnerId
    chunks: AsyncGenerator[Chunk, None]


class Master:
    def __init__(self, node: NodeInfo) -> None:
        self.state = apply(State(), NodeJoined(node=node))
        self._worker: Worker | None = None

    def attach_worker(self, worker: Worker) -> None:
        self._worker = worker

    @property
    def worker(self) -> Worker:
        assert self._worker is not None, "the worker is attached at node start"
        return self._worker

    def on_event(self, event: Event) -> None:
        self.state = apply(self.state, event)

    def model_ids(self) -> list[ModelId]:
        return sorted({runner.model_id for runner in self.state.runners.values()})

    def submit_chat_completion(self, command: ChatCompletionCommand) -> TaskHandle:
        """Place the completion on a runner; raises ModelNotLoadedError, QueueFullError or RunnerUnavailableError."""
        runner_id = place_task(self.state, command.model_id)
        if runner_id is None:
            raise ModelNotLoadedError(command.model_id)
        task = ChatCompletionTask(
            task_id=new_task_id(), command_id=command.command_id, model_id=command.model_id, params=command.params
        )
        receiver = self.worker.submit(runner_id, task)

        # The worker reports the task finished once its runner lets go of it (see worker/main.py).
        async def chunks() -> AsyncGenerator[Chunk, None]:
            async with receiver:
                async for chunk in receiver:
                    yield chunk

        return TaskHandle(task_id=task.task_id, runner_id=runner_id, chunks=chunks())

    def cancel(self, command: CancelTaskCommand) -> None:
        """Stop a queued or running task; the runner stops within one generated token."""
        task = self.state.tasks.get(command.task_id)
        if task is not None:
            self.worker.cancel(task.runner_id, command.task_id)
