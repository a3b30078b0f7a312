"""The worker: owns this node's runner supervisors and reports their state to the master as events."""

import time
from collections.abc import Callable

from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream

from exo.shared.types.chunks import Chunk
from exo.shared.types.common import RunnerId, TaskId, new_runner_id
from exo.shared.types.events import Event, RunnerUpdated, TaskUpdated
from exo.shared.types.state import RunnerInfo, TaskInfo
from exo.shared.types.tasks import ChatCompletionTask
from exo.worker.runner.supervisor import RunnerConfig, RunnerSupervisor


class Worker:
    def __init__(self, task_group: TaskGroup, emit: Callable[[Event], None]) -> None:
        self._task_group = task_group
        self._emit = emit
        self._supervisors: dict[RunnerId, RunnerSupervisor] = {}
        self._task_created: dict[TaskId, float] = {}

    def start_runner(self, config: RunnerConfig) -> RunnerSupervisor:
        runner_id = new_runner_id()
        supervisor = RunnerSupervisor(runner_id, config, on_change=lambda: self._report(runner_id))
        self._supervisors[runner_id] = supervisor
        self._report(runner_id)
        self._task_group.start_soon(supervisor.run, name=f"runner-{runner_id}")
        return supervisor

    def supervisor(self, runner_id: RunnerId) -> RunnerSupervisor:
        return self._supervisors[runner_id]

    @property
    def supervisors(self) -> list[RunnerSupervisor]:
        return list(self._supervisors.values())

    def submit(self, runner_id: RunnerId, task: ChatCompletionTask) -> MemoryObjectReceiveStream[Chunk]:
        self._task_created[task.task_id] = time.time()
        return self._supervisors[runner_id].submit(task)

    def forget_task(self, task_id: TaskId) -> None:
        self._task_created.pop(task_id, None)

    def cancel(self, runner_id: RunnerId, task_id: TaskId) -> None:
        self._supervisors[runner_id].cancel(task_id)

    async def stop(self) -> None:
        for supervisor in self._supervisors.values():
            await supervisor.stop()

    def _report(self, runner_id: RunnerId) -> None:
        supervisor = self._supervisors[runner_id]
        config = supervisor.config
        self._emit(
            RunnerUpdated(
                runner=RunnerInfo(
                    runner_id=runner_id,
                    model_id=config.model_id,
                    model_path=str(config.model_path),
                    shard=config.shard,
                    status=supervisor.status,
                    pid=supervisor.pid,
                    restarts=supervisor.restarts,
                    last_error=supervisor.last_error,
                    metadata=supervisor.metadata,
                )
            )
        )
        running = supervisor.running_task_id
        tasks = [(task_id, "queued") for task_id in supervisor.queued_task_ids]
        if running is not None:
            tasks.append((running, "running"))
        for task_id, status in tasks:
            self._emit(
                TaskUpdated(
                    task=TaskInfo(
                        task_id=task_id,
                        model_id=config.model_id,
                        runner_id=runner_id,
                        status="running" if status == "running" else "queued",
                        created_at=self._task_created.get(task_id, time.time()),
                    )
                )
            )
