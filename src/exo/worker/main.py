"""The worker: owns this node's runner supervisors and reports their state to the master as events.

The worker is the only source of task events: a task is reported while its supervisor holds it (queued or running)
and finished once the supervisor lets go of it, however it ended (done, cancelled, failed, crashed).
"""

import time
from collections.abc import Callable

from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream

from exo.shared.types.chunks import Chunk
from exo.shared.types.common import RunnerId, TaskId, new_runner_id
from exo.shared.types.events import Event, RunnerUpdated, TaskFinished, TaskUpdated
from exo.shared.types.state import RunnerInfo, TaskInfo, TaskStatus
from exo.shared.types.tasks import ChatCompletionTask
from exo.worker.runner.supervisor import RunnerConfig, RunnerSupervisor


class Worker:
    def __init__(self, task_group: TaskGroup, emit: Callable[[Event], None]) -> None:
        self._task_group = task_group
        self._emit = emit
        self._supervisors: dict[RunnerId, RunnerSupervisor] = {}
        self._task_created: dict[TaskId, float] = {}
        self._reported_tasks: dict[RunnerId, dict[TaskId, TaskStatus]] = {}

    def start_runner(self, config: RunnerConfig) -> RunnerSupervisor:
        runner_id = new_runner_id()
        supervisor = RunnerSupervisor(runner_id, config, on_change=lambda: self._report(runner_id))
        self._supervisors[runner_id] = supervisor
        self._report(runner_id)
        self._task_group.start_soon(supervisor.run, name=f"runner-{runner_id}")
        return supervisor

    def add_unavailable_runner(self, config: RunnerConfig, reason: str) -> RunnerSupervisor:
        """Register a runner for a model that could not be prepared: /state shows it failed with `reason` and its
        requests are refused with that reason, instead of the model looking as if it was never asked for."""
        runner_id = new_runner_id()
        supervisor = RunnerSupervisor(runner_id, config, on_change=lambda: self._report(runner_id))
        self._supervisors[runner_id] = supervisor
        supervisor.mark_unavailable(reason)
        return supervisor

    def submit(self, runner_id: RunnerId, task: ChatCompletionTask) -> MemoryObjectReceiveStream[Chunk]:
        """Queue `task` on the runner; raises QueueFullError / RunnerUnavailableError (exo.shared.errors)."""
        return self._supervisors[runner_id].submit(task)

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
                    recent_tasks=supervisor.recent_tasks,
                )
            )
        )
        held: dict[TaskId, TaskStatus] = dict.fromkeys(supervisor.queued_task_ids, "queued")
        for running in supervisor.running_task_ids:
            held[running] = "running"
        reported = self._reported_tasks.get(runner_id, {})
        for task_id, status in held.items():
            if reported.get(task_id) == status:
                continue
            created_at = self._task_created.setdefault(task_id, time.time())
            info = TaskInfo(
                task_id=task_id, model_id=config.model_id, runner_id=runner_id, status=status, created_at=created_at
            )
            self._emit(TaskUpdated(task=info))
        for task_id in reported.keys() - held.keys():
            self._task_created.pop(task_id, None)
            self._emit(TaskFinished(task_id=task_id))
        self._reported_tasks[runner_id] = held
