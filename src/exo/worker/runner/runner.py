"""The runner subprocess: loads one model (shard) and executes chat-completion tasks one at a time.

It talks to its supervisor over a multiprocessing Connection, exchanging only typed messages
(`RunnerRequest` in, `RunnerResponse` out) serialised as JSON.
"""

import json
import logging
import os
import signal
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, cast

from pydantic import ValidationError

from exo.shared.types.chunks import ErrorChunk, FinishChunk
from exo.shared.types.common import TaskId
from exo.shared.types.tasks import ChatCompletionTask
from exo.shared.types.worker.runner_response import (
    CancelTask,
    ModelMetadata,
    RunnerBootstrap,
    RunnerLoadFailed,
    RunnerReady,
    RunnerRequest,
    RunnerRequestAdapter,
    RunnerResponse,
    RunnerResponseAdapter,
    RunTask,
    Shutdown,
    TaskChunk,
    TaskDone,
)

if TYPE_CHECKING:
    from exo.worker.engines.mlx.generator.chat_completion import EngineContext

logger = logging.getLogger(__name__)


class UnreadableRequestError(Exception):
    """A message from the supervisor did not validate; `task_id` is the task it was for, when one can be read."""

    def __init__(self, error: ValidationError, payload: bytes) -> None:
        super().__init__(f"{error.error_count()} validation error(s), first: {error.errors()[0]['msg']}")
        self.task_id = _lenient_task_id(payload)


def _lenient_task_id(payload: bytes) -> TaskId | None:
    try:
        message: object = json.loads(payload)
    except ValueError:
        return None
    task = message.get("task") if isinstance(message, dict) else None
    task_id = task.get("task_id") if isinstance(task, dict) else None
    return TaskId(task_id) if isinstance(task_id, str) else None


class RunnerChannel:
    """Typed wrapper around the runner's end of the pipe."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    def send(self, message: RunnerResponse) -> None:
        self._connection.send_bytes(RunnerResponseAdapter.dump_json(message))

    def receive(self) -> RunnerRequest:
        """The next request; raises UnreadableRequestError for one that does not validate, EOFError once the
        supervisor has closed the pipe."""
        payload = self._connection.recv_bytes()
        try:
            return RunnerRequestAdapter.validate_json(payload)
        except ValidationError as error:
            raise UnreadableRequestError(error, payload) from error

    def poll(self) -> bool:
        return self._connection.poll()


class TaskControl:
    """Between tokens: drain the pipe for a cancel (or shutdown) aimed at the running task.

    The engine asks once per generated token, so the number of questions is the number of tokens generated.
    """

    def __init__(self, channel: RunnerChannel, task_id: TaskId) -> None:
        self._channel = channel
        self._task_id = task_id
        self.shutdown_requested = False
        self.tokens_generated = 0
        self.cancelled = False

    def should_cancel(self) -> bool:
        self.tokens_generated += 1
        while not self.cancelled and self._channel.poll():
            match self._channel.receive():
                case CancelTask(task_id=task_id) if task_id == self._task_id:
                    self.cancelled = True
                case Shutdown():
                    self.shutdown_requested = True
                    self.cancelled = True
                case _:
                    pass  # a cancel for a task already finished, or a stray bootstrap: nothing to do
        return self.cancelled


def _read_tool_parser_type(model_path: Path) -> str | None:
    config_path = model_path / "tokenizer_config.json"
    if not config_path.exists():
        return None
    value: object = json.loads(config_path.read_text()).get("tool_parser_type")
    return value if isinstance(value, str) else None


def runner_main(connection: Connection, log_level: int = logging.INFO) -> None:
    """Entry point of the runner subprocess."""
    # Ctrl-C in a terminal reaches the whole process group; the supervisor stops the runner with a Shutdown message,
    # so the interrupt itself must not kill it mid-task with a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format=f"%(asctime)s runner[{os.getpid()}] %(levelname)s %(message)s")
    channel = RunnerChannel(connection)
    bootstrap = channel.receive()
    if not isinstance(bootstrap, RunnerBootstrap):
        channel.send(RunnerLoadFailed(message=f"expected a bootstrap message, got {bootstrap.kind}"))
        return
    try:
        context, metadata = _load(bootstrap)
    except Exception as error:
        # Whatever breaks while loading (unreadable weights, a template the detector rejects, a bad override) is a
        # load failure with a reason, not a crash: a crash would be retried and fail the same way again.
        if isinstance(error, _LoadFailedError):
            reason = str(error)
            logger.error("%s", reason)
        else:
            reason = f"{type(error).__name__}: {error}"
            logger.exception("cannot load %s", bootstrap.model_path)
        channel.send(RunnerLoadFailed(message=reason))
        return
    channel.send(RunnerReady(metadata=metadata))
    logger.info("loaded %s (tool format %s, dtype %s)", bootstrap.model_path, metadata.tool_format, metadata.dtype)
    while True:
        try:
            request = channel.receive()
        except EOFError:
            return  # the supervisor is gone
        except UnreadableRequestError as unreadable:
            _refuse_unreadable(channel, unreadable)
            continue
        match request:
            case RunTask(task=task):
                control = _run_task(channel, context, task)
                if control.shutdown_requested:
                    return
            case Shutdown():
                return
            case CancelTask() | RunnerBootstrap():
                pass  # nothing is running; a late cancel needs no action


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


def _load(bootstrap: RunnerBootstrap) -> tuple["EngineContext", ModelMetadata]:
    # Heavy imports happen here, in the child, so the API process never loads MLX.
    from exo.models.errors import ModelLoadError
    from exo.tool_calls import detect_tool_format
    from exo.worker.engines.mlx.blas_check import blas_report
    from exo.worker.engines.mlx.cache.prefix_cache import PrefixCache
    from exo.worker.engines.mlx.generator.chat_completion import EngineContext
    from exo.worker.engines.mlx.utils_mlx import chat_template_text, load_model

    model_path = Path(bootstrap.model_path)
    blas = blas_report()  # before the model takes the memory bandwidth; a fraction of a second
    try:
        loaded = load_model(model_path, bootstrap.shard, trust_remote_code=bootstrap.trust_remote_code)
        template = chat_template_text(loaded.tokenizer)
        tool_format = detect_tool_format(
            template,
            _read_tool_parser_type(model_path),
            bootstrap.tool_format_override,
            vocabulary=cast(dict[str, int], loaded.tokenizer.get_vocab()),
        )
    except ModelLoadError as error:
        raise _LoadFailedError(str(error)) from error
    except Exception as error:
        raise _LoadFailedError(f"cannot load model from {model_path}: {type(error).__name__}: {error}") from error
    prefix_cache = PrefixCache(loaded.model, bootstrap.prefix_cache_bytes) if bootstrap.prefix_cache_bytes else None
    metadata = ModelMetadata(
        context_length=loaded.context_length,
        tool_format=str(tool_format),
        supports_reasoning=loaded.tokenizer.has_thinking,
        dtype=loaded.dtype,
        vocab_size=loaded.vocabulary_size,
        blas=blas,
    )
    return EngineContext(loaded=loaded, tool_format=tool_format, prefix_cache=prefix_cache), metadata


def _run_task(channel: RunnerChannel, context: "EngineContext", task: ChatCompletionTask) -> TaskControl:
    """Stream one task's chunks, then report it done with how many tokens it generated and whether it was cancelled.

    An exception escaping the engine fails this task with an error chunk instead of killing the runner (and the
    loaded model) for everyone queued behind it.
    """
    from exo.worker.engines.mlx.generator.chat_completion import run_chat_completion

    control = TaskControl(channel, task.task_id)
    generated: int | None = None
    try:
        for chunk in run_chat_completion(context, task, control.should_cancel):
            if isinstance(chunk, FinishChunk):
                generated = chunk.usage.completion_tokens
            channel.send(TaskChunk(task_id=task.task_id, chunk=chunk))
    except Exception as error:
        logger.exception("task %s failed", task.task_id)
        failure = ErrorChunk(error="generation_failed", message=f"generation failed: {type(error).__name__}: {error}")
        channel.send(TaskChunk(task_id=task.task_id, chunk=failure))
    tokens = control.tokens_generated if generated is None else generated
    if control.cancelled:
        logger.info("task %s cancelled after %d generated tokens", task.task_id, tokens)
    channel.send(TaskDone(task_id=task.task_id, generated_tokens=tokens, cancelled=control.cancelled))
    return control
