"""The worker: owns this node's runners and reports what it owns to the master as events.

It prepares each configured model, starts one supervised runner subprocess per model, runs the tasks the master
assigns it (worker/task_streams.py), and publishes every change of its runners and tasks (and, for the node's API,
how each request it took ended). It is the only source of
task events: a task is reported while its supervisor holds it (queued or running) and finished once the supervisor
lets go of it, however it ended (done, cancelled, failed, crashed). Every REPORT_INTERVAL_SECONDS, and whenever a
new master asks, it reports everything it owns in full, which also repairs anything a lost message left behind.
"""

import logging
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.from_thread
import anyio.to_thread
from anyio.abc import TaskGroup

from exo.cluster.bus import Bus
from exo.cluster.membership import Membership
from exo.cluster.topics import Topics
from exo.models.progress import PreparationSink, PreparationTracker
from exo.models.resolve import ResolvedModel, model_id_for, resolve_model
from exo.shared.types.commands import AssignTask, StopTask, WorkerCommandAdapter
from exo.shared.types.common import InstanceId, ModelId, RunnerId, TaskId, new_instance_id, new_runner_id
from exo.shared.types.event_log import LocalEventMessage, ResyncRequestAdapter
from exo.shared.types.events import (
    LocalEvent,
    NodeReported,
    PreparationUpdated,
    RequestEnded,
    RunnerUpdated,
    TaskFinished,
    TaskUpdated,
)
from exo.shared.types.preparation import ModelPreparation
from exo.shared.types.request_record import RECENT_REQUESTS_PER_NODE, RequestRecord
from exo.shared.types.state import NodeFacts, RunnerInfo, TaskInfo, TaskOutcome
from exo.worker.runner.runner_config import RunnerConfig
from exo.worker.runner.supervisor import RunnerSupervisor
from exo.worker.runner_metrics import RunnerMetricsRecorder
from exo.worker.task_streams import StreamTimings, TaskStreams

logger = logging.getLogger(__name__)

REPORT_INTERVAL_SECONDS = 5.0

RunnerConfigFor = Callable[[ModelId, Path], RunnerConfig]


class Worker:
    def __init__(
        self,
        task_group: TaskGroup,
        bus: Bus,
        topics: Topics,
        membership: Membership,
        *,
        describe_node: Callable[[], NodeFacts],
        show_progress: PreparationSink,
    ) -> None:
        self._task_group = task_group
        self._bus = bus
        self._topics = topics
        self._node_id = membership.node_id
        self._describe_node = describe_node
        self._show_progress = show_progress
        self._supervisors: dict[RunnerId, RunnerSupervisor] = {}
        self._instances: dict[RunnerId, InstanceId] = {}
        self._metrics: dict[RunnerId, RunnerMetricsRecorder] = {}
        self._preparing: list[str] = []
        self._preparations: dict[ModelId, ModelPreparation] = {}
        self._task_created: dict[TaskId, float] = {}
        self._reported_tasks: dict[RunnerId, dict[TaskId, TaskInfo]] = {}
        self._recent_requests: deque[RequestRecord] = deque(maxlen=RECENT_REQUESTS_PER_NODE)
        self._sequence = 0
        self.streams = TaskStreams(bus, topics, self._node_id, task_group, self._on_task_ended)
        # Subscribed now, before anything runs, so no assignment sent during start-up is missed.
        self._commands = bus.subscribe(topics.worker_commands(self._node_id), WorkerCommandAdapter)
        self._resync_requests = bus.subscribe(topics.resync, ResyncRequestAdapter)
        membership.on_change(self.streams.on_membership)

    async def run(self) -> None:
        """Report this node, then serve the master's assignments until cancelled."""
        self.report_in_full()
        async with anyio.create_task_group() as group:
            group.start_soon(self._serve_commands)
            group.start_soon(self._answer_resync_requests)
            group.start_soon(self._report_periodically)

    # ---- runners ----------------------------------------------------------------------------

    async def prepare_and_load(
        self,
        spec: str | None,
        runner_config_for: RunnerConfigFor,
        models_dir: Path | None,
        place: Callable[[ModelId, Path], None] | None = None,
    ) -> None:
        """Resolve `spec` (download/convert as needed), then start its runner (or hand it to `place`, which places it
        over the cluster); a failure leaves a failed runner."""
        label = spec or "default"
        self._preparing.append(label)
        self.report_in_full()
        try:
            resolved = await anyio.to_thread.run_sync(self._resolve_with_progress, spec, models_dir)
        except Exception as error:
            # Keep serving the other models; this one shows up in /state as failed and its requests get a 503
            # that names the reason.
            logger.error("cannot prepare model %s: %s", label, error)
            self._end_preparing(label)
            reason = f"cannot prepare model {label}: {error}"
            self.add_unavailable_runner(runner_config_for(model_id_for(spec), Path(spec or label)), reason)
            return
        self._end_preparing(label)
        if place is not None:
            place(resolved.model_id, resolved.path)
        else:
            self.start_runner(runner_config_for(resolved.model_id, resolved.path))

    async def prepare(self, spec: str, models_dir: Path | None) -> ResolvedModel:
        """Resolve `spec` to a local model (download/convert as needed, with progress in /state)."""
        self._preparing.append(spec)
        self.report_in_full()
        try:
            return await anyio.to_thread.run_sync(self._resolve_with_progress, spec, models_dir)
        finally:
            self._end_preparing(spec)

    def _end_preparing(self, label: str) -> None:
        # Reported before the runner appears, so the state never shows the model both preparing and served.
        self._preparing.remove(label)
        self.report_in_full()

    def _resolve_with_progress(self, spec: str | None, models_dir: Path | None) -> ResolvedModel:
        """Runs in a worker thread: resolve `spec`, publishing download and conversion progress as it goes."""
        tracker = PreparationTracker(model_id_for(spec), (self._show_progress, self.publish_preparation))
        try:
            resolved = resolve_model(spec, models_dir, tracker)
        except Exception as error:
            if tracker.last is not None:
                tracker.fail(str(error))
            raise
        if tracker.last is not None:
            tracker.finish()
        return resolved

    def publish_preparation(self, preparation: ModelPreparation) -> None:
        """Record a preparation's progress as this node's; called from the thread doing the work (events are
        published from the event loop, in order)."""
        anyio.from_thread.run_sync(self._record_preparation, preparation)

    def _record_preparation(self, preparation: ModelPreparation) -> None:
        self._preparations[preparation.model_id] = preparation
        self._publish(PreparationUpdated(preparation=preparation))

    def record_request(self, record: RequestRecord) -> None:
        """Report how a request this node's API took ended (from the event loop, like every event)."""
        self._recent_requests.append(record)
        self._publish(RequestEnded(record=record))

    def start_runner(self, config: RunnerConfig, instance_id: InstanceId | None = None) -> RunnerSupervisor:
        """Start a runner: a whole model (its own instance) or one rank of the placed instance `instance_id`."""
        supervisor = self._register(config, instance_id)
        self._report(supervisor.runner_id)
        self._task_group.start_soon(supervisor.run, name=f"runner-{supervisor.runner_id}")
        return supervisor

    async def remove_runner(self, runner_id: RunnerId) -> None:
        """Stop a runner for good (its instance is gone) and drop it from what this node reports."""
        supervisor = self._supervisors.get(runner_id)
        if supervisor is None:
            return
        model_id = supervisor.config.model_id
        await supervisor.stop(f"the instance serving {model_id} was removed (a node of it left, or it was replaced)")
        del self._supervisors[runner_id]
        self._instances.pop(runner_id, None)
        self._metrics.pop(runner_id, None)
        self._reported_tasks.pop(runner_id, None)
        self.report_in_full()

    def add_unavailable_runner(self, config: RunnerConfig, reason: str) -> RunnerSupervisor:
        """Register a runner for a model that could not be prepared: /state shows it failed with `reason` and its
        requests are refused with that reason, instead of the model looking as if it was never asked for."""
        supervisor = self._register(config)
        supervisor.mark_unavailable(reason)
        return supervisor

    async def stop(self) -> None:
        for supervisor in self._supervisors.values():
            await supervisor.stop()

    def kill_runners(self) -> None:
        """Kill every runner process now, without waiting (a forced exit)."""
        for supervisor in self._supervisors.values():
            supervisor.kill()
        for supervisor in self._supervisors.values():
            supervisor.reap()

    def _register(self, config: RunnerConfig, instance_id: InstanceId | None = None) -> RunnerSupervisor:
        runner_id = new_runner_id()
        supervisor = RunnerSupervisor(runner_id, config, on_change=lambda: self._report(runner_id))
        self._supervisors[runner_id] = supervisor
        self._instances[runner_id] = instance_id or new_instance_id()
        self._metrics[runner_id] = RunnerMetricsRecorder()
        return supervisor

    # ---- commands ---------------------------------------------------------------------------

    async def _serve_commands(self) -> None:
        async with self._commands as commands:
            async for command in commands:
                match command:
                    case AssignTask(runner_id=runner_id):
                        self.streams.start(command, self._supervisors.get(runner_id))
                    case StopTask(task_id=task_id):
                        self.streams.stop(task_id)

    def _on_task_ended(self, runner_id: RunnerId, outcome: TaskOutcome, timings: StreamTimings) -> None:
        if runner_id not in self._metrics:
            return  # its runner was removed meanwhile
        self._metrics[runner_id].record(
            outcome,
            first_token_seconds=timings.first_token_seconds,
            decode_seconds=timings.decode_seconds,
            usage=timings.usage,
        )
        self._report(runner_id)

    # ---- events -----------------------------------------------------------------------------

    def _publish(self, event: LocalEvent) -> None:
        self._sequence += 1
        message = LocalEventMessage(origin=self._node_id, sequence=self._sequence, event=event)
        self._bus.publish(self._topics.local_events, message)

    def report_in_full(self) -> None:
        """Publish everything this node owns: its facts, preparations, runners, held tasks and recent requests."""
        tasks = [task for held in self._reported_tasks.values() for task in held.values()]
        self._publish(
            NodeReported(
                facts=self._describe_node(),
                preparing=tuple(self._preparing),
                preparations=dict(self._preparations),
                runners=tuple(self._runner_info(runner_id) for runner_id in self._supervisors),
                tasks=tuple(tasks),
                recent_requests=tuple(self._recent_requests),
            )
        )

    async def _answer_resync_requests(self) -> None:
        async with self._resync_requests as requests:
            async for _ in requests:
                self.report_in_full()

    async def _report_periodically(self) -> None:
        while True:
            await anyio.sleep(REPORT_INTERVAL_SECONDS)
            self.report_in_full()

    def _runner_info(self, runner_id: RunnerId) -> RunnerInfo:
        supervisor = self._supervisors[runner_id]
        config = supervisor.config
        return RunnerInfo(
            runner_id=runner_id,
            node_id=self._node_id,
            instance_id=self._instances[runner_id],
            model_id=config.model_id,
            model_path=str(config.model_path),
            shard=config.shard,
            status=supervisor.status,
            pid=supervisor.pid,
            restarts=supervisor.restarts,
            last_error=supervisor.last_error,
            metadata=supervisor.metadata,
            description=supervisor.description if supervisor.metadata is None else None,
            recent_tasks=supervisor.recent_tasks,
            metrics=self._metrics[runner_id].metrics,
            tokens_per_second_now=round(supervisor.tokens_per_second_now, 2),
            step_times=supervisor.step_times,
            prefill_pieces=supervisor.prefill_pieces,
            ggml_threads=supervisor.ggml_threads,
            resident_bytes=supervisor.resident_bytes,
            memory=supervisor.memory,
        )

    def _task_info(self, runner_id: RunnerId, task_id: TaskId, *, running: bool) -> TaskInfo:
        supervisor = self._supervisors[runner_id]
        phase, progress = supervisor.progress(task_id)
        return TaskInfo(
            task_id=task_id,
            model_id=supervisor.config.model_id,
            runner_id=runner_id,
            node_id=self._node_id,
            requested_by=self.streams.requested_by(task_id),
            status="running" if running else "queued",
            created_at=self._task_created.setdefault(task_id, time.time()),
            phase=phase,
            prompt_tokens=progress.prompt_tokens if progress else None,
            done_tokens=progress.done_tokens if progress else None,
            cached_tokens=progress.cached_tokens if progress else None,
        )

    def _report(self, runner_id: RunnerId) -> None:
        supervisor = self._supervisors.get(runner_id)
        if supervisor is None:
            return  # removed while a change of its was on the way
        self._publish(RunnerUpdated(runner=self._runner_info(runner_id)))
        held = {task_id: self._task_info(runner_id, task_id, running=False) for task_id in supervisor.queued_task_ids}
        for task_id in supervisor.running_task_ids:
            held[task_id] = self._task_info(runner_id, task_id, running=True)
        reported = self._reported_tasks.get(runner_id, {})
        # Finished tasks go first: a reader folding these events one by one never sees more tasks running than the
        # runner's batch holds (the task that took a finished one's place would otherwise show beside it).
        for task_id in reported.keys() - held.keys():
            self._task_created.pop(task_id, None)
            self._publish(TaskFinished(task_id=task_id))
        for task_id, task in held.items():
            if reported.get(task_id) != task:
                self._publish(TaskUpdated(task=task))
        self._reported_tasks[runner_id] = held
