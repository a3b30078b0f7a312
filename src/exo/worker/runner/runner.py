"""The runner subprocess: loads one model (shard) and decodes its chat-completion tasks, several at once.

It talks to its supervisor over a multiprocessing Connection, exchanging only typed messages
(`RunnerRequest` in, `RunnerResponse` out) serialised as JSON.
"""

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING

from exo.shared.freed_memory import freeze_long_lived
from exo.shared.types.chunks import Chunk, ErrorChunk
from exo.shared.types.tasks import GenerationTask
from exo.shared.types.worker.runner_response import (
    CancelTask,
    MatmulPlanRefined,
    ModelDescription,
    ModelMetadata,
    RunnerBootstrap,
    RunnerDescribed,
    RunnerLoadFailed,
    RunnerReady,
    RunnerRequest,
    RunTask,
    Shutdown,
    TaskChunk,
    TaskDone,
)
from exo.worker.engines.mlx.cpu.core_share import current_ggml_threads
from exo.worker.engines.mlx.cpu.rank_threads import idle_threads_sleep
from exo.worker.engines.mlx.step_clock import STEP_CLOCK
from exo.worker.ring_deadline import RING_NOT_FORMED_EXIT_CODE, RingNotFormedError
from exo.worker.runner.arrival_window import ArrivalWindow
from exo.worker.runner.channel import RunnerChannel, UnreadableRequestError
from exo.worker.runner.idle_snapshots import write_snapshots_before_stopping, write_snapshots_while_idle
from exo.worker.runner.memory_reports import MemoryReports
from exo.worker.runner.pipeline_link import PipelineLink
from exo.worker.runner.pipeline_serving import serve_pipeline
from exo.worker.runner.step_meter import StepMeter
from exo.worker.runner.step_sender import StepSender
from exo.worker.runner.task_replies import report_cancel

if TYPE_CHECKING:
    from mlx import nn

    from exo.worker.engines.mlx.cache.prefix_cache import PrefixCache
    from exo.worker.engines.mlx.cpu.matmul_planner import MatmulPlanner
    from exo.worker.engines.mlx.generator.draft_policy import StepCosts
    from exo.worker.engines.mlx.generator.request_context import EngineContext
    from exo.worker.engines.mlx.generator.scheduler import GenerationScheduler

logger = logging.getLogger(__name__)

ORPHAN_CHECK_SECONDS = 1.0
IDLE_SECONDS_PER_PLAN_REFINEMENT = 0.2
"""While no task runs, the matmul plan is refined at most once per this many seconds without a message (a few
products each time, then one forward pass each while the plan is checked in whole passes: a request arriving then
waits at most about one decode step)."""
IDLE_REST_PER_BUSY_SECOND = 3.0
"""After each step of refining the matmul plan the idle runner waits three times as long as the step took (at least
IDLE_SECONDS_PER_PLAN_REFINEMENT): refinement takes at most a quarter of an idle runner's time, so what else runs in
the minutes after a start (a benchmark, a user's first requests) shares the cores with it less."""


def runner_main(connection: Connection, log_level: int = logging.INFO) -> None:
    """Entry point of the runner subprocess."""
    # Ctrl-C in a terminal reaches the whole process group; the supervisor stops the runner with a Shutdown message,
    # so the interrupt itself must not kill it mid-task with a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format=f"%(asctime)s runner[{os.getpid()}] %(levelname)s %(message)s")
    _exit_when_orphaned()
    channel = RunnerChannel(connection)
    try:
        _run(channel)
    finally:
        channel.close()  # what was sent reaches the supervisor before the process ends


NO_NVIDIA_DRIVER = (
    "mlx's CUDA build is installed but this machine has no NVIDIA driver (libcuda.so.1): install the driver, or "
    "serve on the CPU with mlx's CPU build (a plain `uv run exo`, without the CUDA group, installs it back)"
)


NO_MLX_BACKEND = (
    "no mlx backend is installed (the `cpu` dependency group was left out): a plain `uv run exo` installs the CPU "
    "build; on an NVIDIA machine add `--group cuda13` (or `cuda12`) to `--no-group cpu`; installed with pip, install "
    "exo with its backend as an extra, `pip install '.[cpu]'` (or `'.[cuda13]'`), or add `pip install 'mlx[cpu]'`"
)


def load_failure_reason(error: Exception) -> str:
    """What a load that raised `error` tells the user: the error, and the fix where it is a known set-up mistake."""
    reason = f"{type(error).__name__}: {error}"
    if isinstance(error, ImportError) and "libcuda.so" in str(error):
        return f"{reason} ({NO_NVIDIA_DRIVER})"
    if isinstance(error, ImportError) and "libmlx.so" in str(error):
        return f"{reason} ({NO_MLX_BACKEND})"
    return reason


def _run(channel: RunnerChannel) -> None:
    """Load the model the bootstrap names, then serve it (alone or as a pipeline rank) until shut down."""
    bootstrap = channel.receive()
    if not isinstance(bootstrap, RunnerBootstrap):
        channel.send(RunnerLoadFailed(message=f"expected a bootstrap message, got {bootstrap.kind}"))
        return
    if bootstrap.shard.peers is not None:
        idle_threads_sleep(os.environ)  # before the first BLAS call (the load's self-check)
    try:
        context, metadata, link = _load(
            bootstrap, lambda description: channel.send(RunnerDescribed(description=description))
        )
    except RingNotFormedError as error:
        # Not the model's fault: the other ranks are not up yet (or gone). The supervisor starts this one again.
        logger.warning("%s; exiting to be started again", error)
        sys.exit(RING_NOT_FORMED_EXIT_CODE)
    except Exception as error:
        # Whatever breaks while loading (unreadable weights, a template the detector rejects, a bad override) is a
        # load failure with a reason, not a crash: a crash would be retried and fail the same way again.
        if isinstance(error, _LoadFailedError):
            reason = str(error)
            logger.error("%s", reason)
        else:
            reason = load_failure_reason(error)
            logger.exception("cannot load %s", bootstrap.model_path)
        channel.send(RunnerLoadFailed(message=reason))
        return
    step_costs = _measured_step_costs(context) if link is None else None
    freeze_long_lived()  # what the load made lives as long as the runner: no collection need walk it again
    channel.send(RunnerReady(metadata=metadata))
    logger.info(
        "loaded %s (tool format %s, dtype %s, weights %.2f GB, batches up to %d requests, prompt-lookup "
        "speculation %s)",
        bootstrap.model_path,
        metadata.tool_format,
        metadata.dtype,
        (metadata.weights_bytes or 0) / 1e9,
        metadata.batch_size,
        "on" if bootstrap.decode.speculation is not None else "off",
    )
    if link is None:
        _serve(channel, context, step_costs)
        return
    reason = serve_pipeline(channel, context, link, lambda wait: _incoming(channel, wait=wait))
    link.close()
    if reason is not None:
        # Exiting is the way out of a broken ring (mlx forms one per process); the supervisor starts this rank anew.
        raise SystemExit(f"rank {bootstrap.shard.rank} leaves its pipeline: {reason}")


def _exit_when_orphaned() -> None:
    """End this process if the node that started it dies: a runner left behind would hold its memory (and a
    pipeline rank would keep its peers waiting)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(ORPHAN_CHECK_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


def _measured_step_costs(context: "EngineContext") -> "StepCosts | None":
    """Pass costs measured before serving where a one-token step is the CPU engine's decode graph and a longer pass
    is not (`step_cost_probe.py`): the draft policy knows them before the first request's first draft."""
    from exo.worker.engines.mlx.cpu.decode_graph import decode_graph_of
    from exo.worker.engines.mlx.generator.draft_policy import StepCosts
    from exo.worker.engines.mlx.generator.step_cost_probe import measure_step_costs

    speculation = context.decode.speculation
    if speculation is None or not speculation.adaptive or decode_graph_of(context.loaded.model) is None:
        return None
    costs = StepCosts()
    measure_step_costs(context.loaded.model, costs, speculation.max_draft_tokens + 1)
    return costs


def _serve(channel: RunnerChannel, context: "EngineContext", step_costs: "StepCosts | None" = None) -> None:
    """Admit tasks, cancel them and advance every active one a token at a time until told to shut down.

    Messages are read between decode steps, so a task arriving while others decode joins them at the next token and
    a cancel takes effect within one token. The first task at an idle runner waits a short window (`arrival_window`)
    for the tasks sent with it, so they are prefilled together.
    """
    from exo.worker.engines.mlx.generator.scheduler import GenerationScheduler
    from exo.worker.runner.idle_turns import IdleTurns

    prefix_cache = context.prefix_cache
    scheduler = GenerationScheduler(
        context.loaded.model,
        context.decode,
        on_prefill_piece=prefix_cache.prefilled if prefix_cache is not None else None,
    )
    if step_costs is not None:
        scheduler.step_costs = step_costs
    meter = StepMeter()
    window = ArrivalWindow()
    sender = StepSender(channel)
    meter.begin()
    turns = IdleTurns()
    memory = MemoryReports(channel, prefix_cache)
    while True:
        if scheduler.active == 0 and prefix_cache is not None:
            write_snapshots_while_idle(prefix_cache, channel.poll)
        if scheduler.active == 0:
            turns.idle()
            memory.report()
        if scheduler.active == 0 and context.matmul_planner is not None:
            _refine_while_idle(channel, context.matmul_planner)
        idle = scheduler.active == 0
        with STEP_CLOCK.part("messages"):
            # Each decode step asks the watcher's flag first: no system call (channel.py).
            incoming = _incoming(channel, wait=idle) if idle or channel.message_waiting() else []
        if idle:
            meter.begin()  # the wait for a message was idle time, not part of a step
        if incoming:
            sender.flush()  # what the steps made goes before a cancel's reply or a new task's first message
        if not _handle(channel, context, scheduler, incoming):
            return
        if idle and scheduler.active > 0 and context.decode.batch_size > 1:
            # The first request at an idle runner: admit the ones sent with it before anything is prefilled.
            first = time.monotonic()
            deadline = window.deadline(first, first)
            while (left := deadline - time.monotonic()) > 0 and channel.poll(left):
                if not _handle(channel, context, scheduler, _incoming(channel, wait=False)):
                    return
                deadline = window.deadline(first, time.monotonic())
        decoding = scheduler.decoding
        if scheduler.active > 0:
            turns.working()
        try:
            updates = scheduler.step()
        except Exception as error:
            # A bug outside any one request's generation: fail what is running rather than the runner (and the
            # loaded model) for everyone queued behind it.
            logger.exception("decode step failed")
            updates = scheduler.fail_all(error)
        wall = meter.end(decoding)
        if decoding == 1:
            window.record_step(wall)
        # The step's message carries the tasks that ended in it with the meter's totals through this step, so the
        # send is metered as the first part of the next step (the idle wait after a runner's last step drops it).
        meter.begin()
        with STEP_CLOCK.part("send"):
            if any(update.done for update in updates):  # the totals travel with a task's end only
                sender.step(
                    updates,
                    meter.totals,
                    dict(scheduler.prefill_stats.by_prompts),
                    ggml_threads=current_ggml_threads(),
                    memory=memory.at_task_end(),
                )
            else:
                sender.step(updates, quick_next=scheduler.active == scheduler.decoding)


def _handle(
    channel: RunnerChannel,
    context: "EngineContext",
    scheduler: "GenerationScheduler",
    incoming: list[RunnerRequest],
) -> bool:
    """Admit, cancel or stop as the supervisor asks; False once told to shut down."""
    for request in incoming:
        match request:
            case RunTask(task=task):
                with STEP_CLOCK.part("admit"):
                    _admit(channel, context, scheduler, task)
            case CancelTask(task_id=task_id):
                report_cancel(channel, task_id, scheduler.cancel(task_id))
            case Shutdown():
                if context.prefix_cache is not None:
                    write_snapshots_before_stopping(context.prefix_cache)
                return False
            case RunnerBootstrap():
                pass
    return True


def _refine_while_idle(channel: RunnerChannel, planner: "MatmulPlanner") -> None:
    """Refine the matmul plan a step at a time until a message arrives (it is served first; refinement resumes
    when the runner is idle again) or nothing is left to refine, resting between steps."""
    rest = IDLE_SECONDS_PER_PLAN_REFINEMENT
    while planner.refining and not channel.poll(rest):
        started = time.monotonic()
        planner.refine()
        rest = max(IDLE_SECONDS_PER_PLAN_REFINEMENT, IDLE_REST_PER_BUSY_SECOND * (time.monotonic() - started))
        if not planner.refining:
            report = planner.report()
            dropped = f", {planner.refinements_dropped} refinements dropped" if planner.refinements_dropped else ""
            logger.info(
                "matmul plan refined while idle (%.1f s measured%s): %s",
                planner.idle_seconds,
                dropped,
                report.describe(),
            )
            channel.send(MatmulPlanRefined(report=report))


def _incoming(channel: RunnerChannel, *, wait: bool) -> list[RunnerRequest]:
    """Every message waiting on the pipe; with `wait`, block until there is at least one.

    A message that does not validate is answered here (its task fails); a closed pipe (the supervisor is gone)
    reads as a Shutdown.
    """
    messages: list[RunnerRequest] = []
    while wait or channel.poll():
        wait = False
        try:
            messages.append(channel.receive())
        except EOFError:
            return [*messages, Shutdown()]
        except UnreadableRequestError as unreadable:
            _refuse_unreadable(channel, unreadable)
    return messages


def _admit(
    channel: RunnerChannel, context: "EngineContext", scheduler: "GenerationScheduler", task: GenerationTask
) -> None:
    """Start a task, or answer it at once (the error that keeps it from starting, or a prompt-token count)."""
    from exo.worker.engines.mlx.generator.chat_completion import ChatRequest
    from exo.worker.engines.mlx.generator.request_context import ImmediateReplyError

    reply: Chunk
    try:
        request = ChatRequest.open(context, task, rewinds=True)
        scheduler.admit(request)
        channel.send(TaskChunk(task_id=task.task_id, chunk=request.prefill_progress(request.cached_tokens)))
        return
    except ImmediateReplyError as immediate:
        reply = immediate.chunk
    except Exception as error:
        logger.exception("task %s could not start", task.task_id)
        reply = ErrorChunk(error="generation_failed", message=f"generation failed: {type(error).__name__}: {error}")
    channel.send(TaskChunk(task_id=task.task_id, chunk=reply))
    channel.send(TaskDone(task_id=task.task_id))


def _refuse_unreadable(channel: RunnerChannel, unreadable: UnreadableRequestError) -> None:
    """A request that does not validate: fail its task (so the supervisor's queue moves on) when it names one."""
    task_id = unreadable.task_id
    logger.error("unreadable request from the supervisor (task %s): %s", task_id, unreadable)
    if task_id is not None:
        failure = ErrorChunk(
            error="dispatch_failed", message=f"the model runner could not read the request: {unreadable}"
        )
        channel.send(TaskChunk(task_id=task_id, chunk=failure))
        channel.send(TaskDone(task_id=task_id))


class _LoadFailedError(Exception):
    """Loading failed; the message names the model path and the cause."""


def _load(
    bootstrap: RunnerBootstrap,
    on_described: Callable[[ModelDescription], None],
) -> tuple["EngineContext", ModelMetadata, PipelineLink | None]:
    """Load the model: read its tokenizer and describe it (`on_described`, before the weights load), then load it (a
    pipeline rank first joins its ring, then loads only its layers, then meets the other ranks' task
    connections)."""
    # Heavy imports happen here, in the child, so the API process never loads MLX.
    from exo.models.errors import ModelLoadError
    from exo.tool_calls import ToolFormatName
    from exo.worker.engines.mlx.cache.layer_cache import can_batch
    from exo.worker.engines.mlx.constrained.compiled import prepare_guidance
    from exo.worker.engines.mlx.cpu.blas_check import blas_report, set_blas_threads
    from exo.worker.engines.mlx.cpu.engine import CpuKernels, held_bytes
    from exo.worker.engines.mlx.cpu.matmul_planner import MatmulPlanner
    from exo.worker.engines.mlx.cpu.q8_layers import BLAS_THREADS
    from exo.worker.engines.mlx.generator.prefill import slow_prefill_seconds_per_token
    from exo.worker.engines.mlx.generator.request_context import EngineContext
    from exo.worker.engines.mlx.model_description import describe_model
    from exo.worker.engines.mlx.model_loader import load_model, load_model_tokenizer

    model_path = Path(bootstrap.model_path)
    kernels = CpuKernels(bootstrap.cpu_kernels, weights=bootstrap.cpu_weights, model_path=model_path)
    blas = blas_report()  # before the model takes the memory bandwidth; a fraction of a second
    try:
        tokenizer = load_model_tokenizer(model_path, trust_remote_code=bootstrap.trust_remote_code)
        description = describe_model(model_path, tokenizer, bootstrap.tool_format_override)
    except ModelLoadError as error:
        raise _LoadFailedError(str(error)) from error
    except Exception as error:
        raise _LoadFailedError(f"cannot load model from {model_path}: {type(error).__name__}: {error}") from error
    on_described(description)
    link = PipelineLink.join(bootstrap.shard, bootstrap.pipeline_tls) if bootstrap.shard.peers is not None else None
    try:
        loaded = load_model(
            model_path,
            bootstrap.shard,
            trust_remote_code=bootstrap.trust_remote_code,
            group=link.group if link is not None else None,
            cpu_kernels=kernels,
            tokenizer=tokenizer,
        )
    except ModelLoadError as error:
        raise _LoadFailedError(str(error)) from error
    except Exception as error:
        raise _LoadFailedError(f"cannot load model from {model_path}: {type(error).__name__}: {error}") from error
    if loaded.dtype in ("q8_0", "gguf"):
        threaded = set_blas_threads(BLAS_THREADS)
        if threaded is not None:
            logger.info(
                "%s weights: %s on %d thread (ggml's products take the cores)",
                loaded.dtype.upper(),
                threaded.name,
                BLAS_THREADS,
            )
    tool_format = ToolFormatName(description.tool_format)
    planner = (
        MatmulPlanner.for_loaded(loaded)
        if kernels.allow_matmul_plan(bootstrap.decode.matmul_plan, loaded.dtype)
        else None
    )
    if bootstrap.shard.rank == 0:  # the rank that takes the tasks and builds their grammars
        guidance_seconds = prepare_guidance(loaded.tokenizer)
        if guidance_seconds is not None:
            logger.info("constrained decoding prepared in %.2f s (llguidance tokenizer)", guidance_seconds)
    prefix_cache = _prefix_cache(bootstrap, loaded.model, loaded.dtype) if bootstrap.prefix_cache_bytes else None
    # A model whose KV cache mlx-lm cannot merge across sequences (some recurrent or sliding-window layers) serves its
    # requests one at a time.
    decode = bootstrap.decode.model_copy(
        update={
            "batch_size": bootstrap.decode.batch_size if can_batch(loaded.model) else 1,
            "slow_prefill_seconds_per_token": slow_prefill_seconds_per_token(os.environ),
        }
    )
    metadata = ModelMetadata(
        **description.model_dump(),
        dtype=loaded.dtype,
        batch_size=decode.batch_size,
        blas=blas,
        matmul_plan=planner.report() if planner is not None else None,
        cpu_kernels=kernels.report(),
        pipeline=loaded.strategy,
        weights_bytes=held_bytes(loaded.model),
    )
    context = EngineContext(
        loaded=loaded, tool_format=tool_format, prefix_cache=prefix_cache, decode=decode, matmul_planner=planner
    )
    if link is not None:
        link.connect_tasks()
    return context, metadata, link


def _prefix_cache(bootstrap: RunnerBootstrap, model: "nn.Module", weights_format: str) -> "PrefixCache":
    """The prefix cache, with its disk tier in a folder of its own for this model's identity (its weights' format
    and this rank's layers) when the bootstrap names a folder and a budget."""
    from exo.worker.engines.mlx.cache.disk_tier import DiskTier
    from exo.worker.engines.mlx.cache.model_identity import model_identity
    from exo.worker.engines.mlx.cache.prefix_cache import PrefixCache

    disk: DiskTier | None = None
    if bootstrap.prefix_cache_dir is not None and bootstrap.prefix_cache_disk_bytes > 0:
        identity = model_identity(Path(bootstrap.model_path), bootstrap.shard, weights_format)
        directory = Path(bootstrap.prefix_cache_dir) / identity[:16]
        try:
            # Snapshots waiting for an idle moment hold their KV in memory: no more than the memory tier's budget. Past
            # half of it they are written beside generation, so a runner that is never idle still persists its sessions.
            disk = DiskTier(
                directory,
                bootstrap.prefix_cache_disk_bytes,
                identity,
                model,
                queue_budget_bytes=bootstrap.prefix_cache_bytes,
                write_beside_above_bytes=bootstrap.prefix_cache_bytes // 2,
            )
        except OSError as error:
            logger.warning("prefix cache: no disk tier (cannot use %s: %s)", directory, error)
        else:
            logger.info(
                "prefix cache: %d disk snapshots (%.2f GB) in %s", disk.entries, disk.nbytes / 1024**3, directory
            )
    return PrefixCache(model, bootstrap.prefix_cache_bytes, disk)
