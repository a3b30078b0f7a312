"""Supervises one runner subprocess: starts it, queues tasks for it (FIFO), routes its chunks, restarts it on crash.

The runner decodes up to its batch size of tasks at once (continuous batching): that many are handed to it, each
chunk it streams back names its task, and the rest wait here in arrival order until one of them finishes.

A crash of the runner fails only the tasks it was running; the API process is untouched and queued tasks run once
the replacement runner has loaded. Handing a task over is guarded the same way: a task that cannot be encoded for the
pipe fails alone and the next one is dispatched, and a pipe that cannot be written means the runner is gone, so it
is killed and replaced while the task that could not be sent fails with a retryable error.

Restarts back off exponentially while the runner keeps crashing without finishing a task. A model that cannot load
(a load error, or MAX_CONSECUTIVE_LOAD_FAILURES crashes before it became ready) marks the runner failed for good:
queued and later requests get a 503 naming the reason.
"""

import functools
import logging
import math
import multiprocessing
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import anyio
import anyio.to_thread
import psutil
from anyio.streams.memory import MemoryObjectReceiveStream
from pydantic_core import PydanticSerializationError

from exo.shared.errors import QueueFullError, RunnerUnavailableError
from exo.shared.types.chunks import Chunk, ErrorChunk, PrefillProgressChunk, Usage
from exo.shared.types.common import RunnerId, TaskId
from exo.shared.types.runner_status import RunnerStatus
from exo.shared.types.state import TaskOutcome, TaskPhase, TaskSummary
from exo.shared.types.tasks import GenerationTask
from exo.shared.types.worker.runner_response import (
    CancelTask,
    GgmlThreadsReport,
    MatmulPlanRefined,
    ModelDescription,
    ModelMetadata,
    RunnerBootstrap,
    RunnerDescribed,
    RunnerLoadFailed,
    RunnerMemory,
    RunnerMemoryReport,
    RunnerReady,
    RunnerRequest,
    RunnerRequestAdapter,
    RunnerResponse,
    RunTask,
    Shutdown,
    StepOutput,
    StepTimes,
    TaskChunk,
    TaskDone,
)
from exo.worker.ring_deadline import ended_waiting_for_ring
from exo.worker.runner.idle_snapshots import SHUTDOWN_SNAPSHOT_SECONDS
from exo.worker.runner.pending_task import PendingTask
from exo.worker.runner.response_reader import read_responses
from exo.worker.runner.runner import runner_main
from exo.worker.runner.runner_config import RunnerConfig
from exo.worker.runner.token_rate import TokenRate

logger = logging.getLogger(__name__)

MAX_CONSECUTIVE_LOAD_FAILURES = 3
RECENT_TASKS_KEPT = 16
MAX_RESTART_DELAY_SECONDS = 10.0
# While tokens are generated, the runner's rate reaches /state this often (besides its other changes).
RATE_REPORT_SECONDS = 1.0
KILLED_REAP_SECONDS = 2.0
"""How long the node waits for a runner it killed to be gone (SIGKILL takes effect within milliseconds)."""


def restart_delay(consecutive_crashes: int) -> float:
    """Seconds to wait before restarting after the `consecutive_crashes`-th crash in a row: 0.5, 1, 2, 4… up to 10."""
    return min(0.5 * 2 ** max(consecutive_crashes - 1, 0), MAX_RESTART_DELAY_SECONDS)


class _ProcessGoneError(Exception):
    def __init__(self, exit_code: int | None) -> None:
        super().__init__(f"runner process exited with code {exit_code}")
        self.exit_code = exit_code


class RunnerSupervisor:
    """Owns one runner process and its task queue. All methods run on the event loop."""

    def __init__(self, runner_id: RunnerId, config: RunnerConfig, on_change: Callable[[], None] = lambda: None) -> None:
        self.runner_id = runner_id
        self._on_change = on_change
        self.config = config
        self.status: RunnerStatus = "loading"
        self.metadata: ModelMetadata | None = None
        # What the runner said of its model before its weights loaded (model listings show it while it loads).
        self.description: ModelDescription | None = None
        self.step_times: dict[int, StepTimes] = {}
        self.prefill_pieces: dict[int, int] = {}
        """Prompt pieces the runner prefilled, by prompts fed together (as of the last task it finished); step_times is
        the runner's host-overhead meter (decode-step times by requests decoding), as it last reported it."""
        self.ggml_threads: int | None = None
        """ggml's thread count as the runner last reported it (at a task's end); None where it runs no ggml."""
        self.memory: RunnerMemory | None = None
        """The runner's own account of its memory, as of the last task it ended or its last turn to idle."""
        self.last_error: str | None = None
        self.restarts = 0
        self.pid: int | None = None
        self._queue: deque[PendingTask] = deque()
        self._running: dict[TaskId, PendingTask] = {}
        self._connection: Connection | None = None
        self._process: BaseProcess | None = None
        self._stopping = False
        self._load_failures = 0
        self.waited_for_ring = 0
        """Times this runner ended waiting for its pipeline's other ranks and was started again."""
        self._consecutive_crashes = 0
        self._recent: deque[TaskSummary] = deque(maxlen=RECENT_TASKS_KEPT)
        # A cancelled task's usage so far (its stream has no FinishChunk to carry it), until its stream's reader takes
        # it for the runner's counters; the oldest go first if no reader does.
        self._cancelled_usage: OrderedDict[TaskId, Usage] = OrderedDict()
        self._token_rate = TokenRate()
        self._rate_reported_at = 0.0

    # ---- public API -------------------------------------------------------------------------

    @property
    def queued_task_ids(self) -> list[TaskId]:
        return [pending.task.task_id for pending in self._queue]

    @property
    def running_task_ids(self) -> list[TaskId]:
        """Tasks handed to the runner, in the order they were handed over."""
        return list(self._running)

    def progress(self, task_id: TaskId) -> tuple[TaskPhase, PrefillProgressChunk | None]:
        """Where a held task stands, and how far its prompt is read (None before the runner starts it)."""
        running = self._running.get(task_id)
        return (running.phase, running.progress) if running is not None else ("queued", None)

    @property
    def recent_tasks(self) -> tuple[TaskSummary, ...]:
        """How the last tasks ended, oldest first, in the order they left this runner."""
        return tuple(self._recent)

    def take_cancelled_usage(self, task_id: TaskId) -> Usage | None:
        """The usage of a task the runner stopped on a cancel (what it generated, the calls it withdrew), once."""
        return self._cancelled_usage.pop(task_id, None)

    @property
    def gave_up(self) -> bool:
        """The model cannot be loaded: no process will be started again and every request is refused."""
        return self._load_failures >= MAX_CONSECUTIVE_LOAD_FAILURES

    def mark_unavailable(self, reason: str) -> None:
        """Report this runner failed for good without ever starting it (its model could not be prepared)."""
        self._load_failures = MAX_CONSECUTIVE_LOAD_FAILURES
        self.status = "failed"
        self.last_error = reason
        self._on_change()

    def submit(self, task: GenerationTask) -> MemoryObjectReceiveStream[Chunk]:
        """Queue `task`; its chunks arrive on the returned stream, which closes after the last one."""
        if self.gave_up:
            raise RunnerUnavailableError(f"model {self.config.model_id} is unavailable: {self.last_error}")
        if len(self._queue) >= self.config.queue_limit:
            raise QueueFullError(f"{len(self._queue)} requests are already waiting for model {self.config.model_id}")
        sender, receiver = anyio.create_memory_object_stream[Chunk](max_buffer_size=math.inf)
        self._queue.append(PendingTask(task, sender))
        self._dispatch_next()
        self._on_change()
        return receiver

    def cancel(self, task_id: TaskId) -> None:
        """Drop a queued task, or ask the runner to stop a running one (it stops within one token)."""
        for pending in list(self._queue):
            if pending.task.task_id == task_id:
                self._queue.remove(pending)
                pending.sender.close()
                self._record(task_id, "cancelled", 0)
                self._on_change()
                return
        if task_id in self._running:
            self._send(CancelTask(task_id=task_id))

    async def run(self) -> None:
        """Keep a runner alive until `stop()`: start it, pump its messages, restart it when it dies."""
        while not self._stopping:
            try:
                self._start_process()
            except PydanticSerializationError as error:
                self.mark_unavailable(f"the runner's configuration cannot be sent to it: {error}")
                break
            try:
                await self._pump_messages()
            except _ProcessGoneError as gone:
                self._on_process_gone(str(gone), gone.exit_code)
            if self._stopping or self.gave_up:
                break
            await anyio.sleep(restart_delay(self._consecutive_crashes))
            self.restarts += 1

    async def stop(self, reason: str = "the node is shutting down") -> None:
        self._stopping = True
        # Its requests end now, not after the process is gone: a pipeline rank whose peer vanished is stuck on the
        # ring and only exits when killed, 5 s on.
        self._fail_all(reason)
        self._send(Shutdown())
        process = self._process
        if process is not None:
            # Long enough for the runner to write its queued prompt snapshots (idle_snapshots.py), then killed.
            await anyio.to_thread.run_sync(process.join, SHUTDOWN_SNAPSHOT_SECONDS + 3.0)
            if process.is_alive():
                process.kill()
                await anyio.to_thread.run_sync(process.join, KILLED_REAP_SECONDS)
        self.status = "shutdown"
        self._on_change()

    def kill(self) -> None:
        """Send the runner process SIGKILL now (a forced exit: its snapshots go unwritten); `reap` waits for it."""
        if self._process is not None and self._process.is_alive():
            self._process.kill()

    def reap(self, timeout: float = KILLED_REAP_SECONDS) -> None:
        """Wait up to `timeout` s for the killed runner to be gone: SIGKILL only starts its exit (the kernel frees
        its memory first), and a node that exits at once must not leave it running behind."""
        if self._process is not None:
            self._process.join(timeout)

    # ---- process management -----------------------------------------------------------------

    def _start_process(self) -> None:
        """Spawn a runner and send it the bootstrap; raises PydanticSerializationError (before spawning) when the
        configuration cannot cross the pipe (a model path that is not valid Unicode)."""
        bootstrap = RunnerBootstrap(
            model_path=str(self.config.model_path),
            shard=self.config.shard,
            tool_format_override=self.config.tool_format_override,
            prefix_cache_bytes=self.config.prefix_cache_bytes,
            prefix_cache_dir=str(self.config.prefix_cache_dir) if self.config.prefix_cache_dir else None,
            prefix_cache_disk_bytes=self.config.prefix_cache_disk_bytes,
            trust_remote_code=self.config.trust_remote_code,
            decode=self.config.decode,
            cpu_kernels=self.config.cpu_kernels,
            cpu_weights=self.config.cpu_weights,
            pipeline_tls=self.config.pipeline_tls,
        )
        payload = RunnerRequestAdapter.dump_json(bootstrap)
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe(duplex=True)
        process = context.Process(
            target=runner_main, args=(child, self.config.log_level), name=f"exo-runner-{self.runner_id}", daemon=True
        )
        process.start()
        child.close()
        self._process, self._connection, self.pid = process, parent, process.pid
        self.memory = None
        self.status = "loading"
        self._write(payload)
        logger.info("started runner %s (pid %s) for %s", self.runner_id, process.pid, self.config.model_id)
        self._on_change()

    async def _pump_messages(self) -> None:
        connection, process = self._connection, self._process
        assert connection is not None
        assert process is not None

        read = functools.partial(read_responses, connection, process, self._handle, str(self.runner_id))
        await anyio.to_thread.run_sync(read, abandon_on_cancel=True, limiter=anyio.CapacityLimiter(1))
        process.join(timeout=1.0)
        raise _ProcessGoneError(process.exitcode)

    def _send(self, message: RunnerRequest) -> bool:
        """Write a control message (bootstrap, cancel, shutdown); False when the runner could not be reached."""
        try:
            payload = RunnerRequestAdapter.dump_json(message)
        except PydanticSerializationError:
            logger.exception("runner %s: cannot encode a %s message", self.runner_id, message.kind)
            return False
        return self._write(payload)

    def _write(self, payload: bytes) -> bool:
        """Write `payload` to the runner's pipe. A pipe that cannot be written means the runner is gone (or can no
        longer be talked to): it is killed so the message pump sees it exit and a replacement is started."""
        if self._connection is None:
            return False
        try:
            self._connection.send_bytes(payload)
        except (OSError, ValueError) as error:  # BrokenPipe/ConnectionReset, or ValueError for a closed handle
            if not self._stopping:
                logger.warning("runner %s cannot be written to (%s); it will be replaced", self.runner_id, error)
                if self._process is not None and self._process.is_alive():
                    self._process.kill()
            return False
        return True

    # ---- message handling -------------------------------------------------------------------

    def _handle(self, message: RunnerResponse) -> None:
        match message:
            case RunnerDescribed(description=description):
                self.description = description
                self._on_change()
            case RunnerReady(metadata=metadata):
                self.metadata = metadata
                logger.info(
                    "runner %s for %s is ready; CPU kernels: %s; BLAS: %s",
                    self.runner_id,
                    self.config.model_id,
                    metadata.cpu_kernels.describe() if metadata.cpu_kernels is not None else "not reported",
                    metadata.blas.describe() if metadata.blas is not None else "not reported",
                )
                if metadata.matmul_plan is not None:
                    logger.info("runner %s few-row matmuls: %s", self.runner_id, metadata.matmul_plan.describe())
                self.status = "ready"
                self._load_failures = 0
                self._dispatch_next()
            case GgmlThreadsReport(threads=threads):  # a follower rank's, as a TaskDone carries rank 0's
                self.ggml_threads = threads
            case RunnerMemoryReport(memory=memory):
                self.memory = memory
            case MatmulPlanRefined(report=report):
                if self.metadata is not None:  # /state shows the plan as refined from now on
                    self.metadata = self.metadata.model_copy(update={"matmul_plan": report})
            case RunnerLoadFailed(message=reason):
                # Loading is deterministic: retrying the same files would fail the same way.
                self._load_failures = MAX_CONSECUTIVE_LOAD_FAILURES
                self.status = "failed"
                self.last_error = reason
                logger.error("runner %s could not load %s: %s", self.runner_id, self.config.model_id, reason)
                self._fail_all(f"model {self.config.model_id} failed to load: {reason}")
            case StepOutput(streams=streams, endings=endings):  # handled as the TaskChunks and TaskDones it stands for
                for stream in streams:
                    for position, chunk in enumerate(stream.chunks, start=1):
                        last = position == len(stream.chunks)
                        self._on_chunk(stream.task_id, chunk, stream.generated_tokens if last else None)
                for done in endings:
                    self._handle(done)
                return
            case TaskChunk(task_id=task_id, chunk=chunk, generated_tokens=generated):
                self._on_chunk(task_id, chunk, generated)
                return
            case TaskDone(task_id=task_id, generated_tokens=tokens, cancelled=cancelled, step_times=step_times):
                if step_times is not None:
                    self.step_times = step_times
                if message.usage is not None and task_id in self._running:
                    self._cancelled_usage[task_id] = message.usage
                    while len(self._cancelled_usage) > RECENT_TASKS_KEPT:
                        self._cancelled_usage.popitem(last=False)
                if message.prefill_pieces is not None:
                    self.prefill_pieces = message.prefill_pieces
                if message.ggml_threads is not None:
                    self.ggml_threads = message.ggml_threads
                if message.memory is not None:
                    self.memory = message.memory
                finished = self._running.pop(task_id, None)
                if finished is not None:
                    self._count_tokens(finished, tokens)
                    finished.sender.close()
                    outcome: TaskOutcome = "cancelled" if cancelled else "failed" if finished.failed else "finished"
                    self._record(task_id, outcome, tokens)
                    if outcome == "finished":
                        self._consecutive_crashes = 0
                if self.status == "running" and not self._running:
                    self.status = "ready"
                self._dispatch_next()
        self._on_change()

    def _on_chunk(self, task_id: TaskId, chunk: Chunk, generated: int | None) -> None:
        running = self._running.get(task_id)
        if running is None:
            return
        running.deliver(chunk)
        if generated is not None:
            self._count_tokens(running, generated)
        phase = running.phase
        if isinstance(chunk, PrefillProgressChunk):
            running.progress = chunk
        else:
            running.decoding = True
        if isinstance(chunk, PrefillProgressChunk) or running.phase != phase:
            self._on_change()  # /state shows the progress; any other chunk only matters when it starts decode

    @property
    def resident_bytes(self) -> int | None:
        """The runner process's resident set size now; None while no runner process is alive."""
        if self._process is None or not self._process.is_alive() or self.pid is None:
            return None
        try:
            return psutil.Process(self.pid).memory_info().rss
        except psutil.Error:
            return None  # it ended between the check and the read

    @property
    def tokens_per_second_now(self) -> float:
        return self._token_rate.per_second()

    def _count_tokens(self, task: PendingTask, generated: int) -> None:
        """Add the tokens `task` generated since last counted to the rate; /state hears of it about once a second."""
        self._token_rate.add(generated - task.counted_tokens)
        task.counted_tokens = max(task.counted_tokens, generated)
        now = time.monotonic()
        if now - self._rate_reported_at >= RATE_REPORT_SECONDS:
            self._rate_reported_at = now
            self._on_change()

    @property
    def _capacity(self) -> int:
        """How many tasks the runner takes at once (its batch size, known once it has loaded)."""
        return self.metadata.batch_size if self.metadata is not None else 1

    def _dispatch_next(self) -> None:
        """Hand queued tasks, oldest first, to the runner while it has room for them (its batch size).

        Whatever fails between leaving the queue and reaching the runner fails that task alone and never leaves the
        supervisor thinking it runs: a task that cannot be encoded is answered with an error and the next one is
        tried; a pipe that cannot be written fails the task (it never started, so a retry is safe) and the runner is
        replaced, after which the rest of the queue runs.
        """
        while self.status in ("ready", "running") and len(self._running) < self._capacity and self._queue:
            pending = self._queue.popleft()
            try:
                payload = RunnerRequestAdapter.dump_json(RunTask(task=pending.task))
            except Exception as error:  # text that is not Unicode, or anything else: this task alone cannot go
                logger.exception("task %s cannot be sent to runner %s", pending.task.task_id, self.runner_id)
                failure = f"the request could not be handed to the model runner: {error}"
                self._fail(pending, ErrorChunk(error="dispatch_failed", message=failure))
                continue
            self._running[pending.task.task_id] = pending
            self.status = "running"
            if not self._write(payload):
                del self._running[pending.task.task_id]
                self.status = "failed"  # until the pump sees the process exit and restarts it
                self._fail(
                    pending,
                    ErrorChunk(
                        error="runner_stopped", message="the model runner stopped before this request started; retry it"
                    ),
                )

    def _on_process_gone(self, reason: str, exit_code: int | None = None) -> None:
        if self._stopping:
            logger.info("runner %s for %s stopped (%s)", self.runner_id, self.config.model_id, reason)
            return  # stop() fails what is left and reports the runner shut down
        crashed_while_loading = self.status == "loading"
        # After reporting a load failure the runner exits on purpose; last_error already holds the reason.
        expected_exit = self.gave_up
        if crashed_while_loading and ended_waiting_for_ring(exit_code):
            # The other ranks were not up yet (a node still copying the files, a rank still loading): no fault of
            # this model, so neither a load failure nor a crash to back off from; started again at once, and still
            # loading meanwhile (a failed rank would make the master place a replacement instance anew).
            self.waited_for_ring += 1
            self.last_error = f"the pipeline's other ranks had not joined its ring ({reason}); waiting for them again"
            logger.warning("runner %s for %s: %s", self.runner_id, self.config.model_id, self.last_error)
            self._on_change()
            return
        self.status = "failed"
        if not expected_exit:
            self._consecutive_crashes += 1
            when = "while loading" if crashed_while_loading else "while serving"
            self.last_error = f"{reason} {when} at {time.strftime('%H:%M:%S')}"
            if crashed_while_loading:
                self._load_failures += 1
        log = logger.info if expected_exit else logger.error
        log("runner %s for %s: %s", self.runner_id, self.config.model_id, reason)
        crashed_tasks = list(self._running.values())
        self._running.clear()
        for running in crashed_tasks:
            running.deliver(
                ErrorChunk(
                    error="runner_crashed",
                    message=f"the model runner crashed while generating ({reason}); it is being restarted",
                )
            )
            running.sender.close()
            self._record(running.task.task_id, "failed", None)
        if self.gave_up:
            self._fail_all(f"model {self.config.model_id} is unavailable: {self.last_error}")
        self._on_change()

    def _record(self, task_id: TaskId, outcome: TaskOutcome, generated_tokens: int | None) -> None:
        self._recent.append(
            TaskSummary(task_id=task_id, outcome=outcome, generated_tokens=generated_tokens, finished_at=time.time())
        )

    def _fail_all(self, message: str) -> None:
        waiting = [*self._queue, *self._running.values()]
        self._queue.clear()
        self._running.clear()
        for pending in waiting:
            self._fail(pending, ErrorChunk(error="model_unavailable", message=message))

    def _fail(self, pending: PendingTask, error: ErrorChunk) -> None:
        """End a task that is no longer queued or running with `error`."""
        pending.deliver(error)
        pending.sender.close()
        self._record(pending.task.task_id, "failed", None)
