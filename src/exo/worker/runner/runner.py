"""The runner subprocess: loads one model (shard) and executes chat-completion tasks one at a time.

It talks to its supervisor over a multiprocessing Connection, exchanging only typed messages
(`RunnerRequest` in, `RunnerResponse` out) serialised as JSON.
"""

import json
import logging
import os
from multiprocessing.connection import Connection
from pathlib import Path

from exo.shared.types.common import TaskId
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


class RunnerChannel:
    """Typed wrapper around the runner's end of the pipe."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    def send(self, message: RunnerResponse) -> None:
        self._connection.send_bytes(RunnerResponseAdapter.dump_json(message))

    def receive(self) -> RunnerRequest:
        return RunnerRequestAdapter.validate_json(self._connection.recv_bytes())

    def poll(self) -> bool:
        return self._connection.poll()


class TaskControl:
    """Between tokens: drain the pipe for a cancel (or shutdown) aimed at the running task."""

    def __init__(self, channel: RunnerChannel, task_id: TaskId) -> None:
        self._channel = channel
        self._task_id = task_id
        self.shutdown_requested = False
        self._cancelled = False

    def should_cancel(self) -> bool:
        while not self._cancelled and self._channel.poll():
            match self._channel.receive():
                case CancelTask(task_id=task_id) if task_id == self._task_id:
                    self._cancelled = True
                case Shutdown():
                    self.shutdown_requested = True
                    self._cancelled = True
                case _:
                    pass  # a cancel for a task already finished, or a stray bootstrap: nothing to do
        return self._cancelled


def _read_tool_parser_type(model_path: Path) -> str | None:
    config_path = model_path / "tokenizer_config.json"
    if not config_path.exists():
        return None
    value: object = json.loads(config_path.read_text()).get("tool_parser_type")
    return value if isinstance(value, str) else None


def runner_main(connection: Connection, log_level: int = logging.INFO) -> None:
    """Entry point of the runner subprocess."""
    logging.basicConfig(level=log_level, format=f"%(asctime)s runner[{os.getpid()}] %(levelname)s %(message)s")
    channel = RunnerChannel(connection)
    bootstrap = channel.receive()
    if not isinstance(bootstrap, RunnerBootstrap):
        channel.send(RunnerLoadFailed(message=f"expected a bootstrap message, got {bootstrap.kind}"))
        return
    # Heavy imports happen here, in the child, so the API process never loads MLX.
    from exo.worker.engines.mlx.cache.prefix_cache import PrefixCache
    from exo.worker.engines.mlx.generator.chat_completion import EngineContext, run_chat_completion
    from exo.worker.engines.mlx.generator.tool_parser import detect_tool_format
    from exo.worker.engines.mlx.utils_mlx import ModelLoadError, chat_template_text, load_model

    model_path = Path(bootstrap.model_path)
    try:
        loaded = load_model(model_path, bootstrap.shard)
    except ModelLoadError as error:
        channel.send(RunnerLoadFailed(message=str(error)))
        return
    template = chat_template_text(loaded.tokenizer)
    tool_format = detect_tool_format(template, _read_tool_parser_type(model_path), bootstrap.tool_format_override)
    prefix_cache = PrefixCache(loaded.model, bootstrap.prefix_cache_bytes) if bootstrap.prefix_cache_bytes else None
    context = EngineContext(loaded=loaded, tool_format=tool_format, prefix_cache=prefix_cache)
    channel.send(
        RunnerReady(
            metadata=ModelMetadata(
                context_length=loaded.context_length,
                tool_format=str(tool_format),
                supports_reasoning=loaded.tokenizer.has_thinking,
                dtype=loaded.dtype,
            )
        )
    )
    logging.getLogger(__name__).info("loaded %s (tool format %s, dtype %s)", model_path, tool_format, loaded.dtype)
    while True:
        match channel.receive():
            case RunTask(task=task):
                control = TaskControl(channel, task.task_id)
                for chunk in run_chat_completion(context, task, control.should_cancel):
                    channel.send(TaskChunk(task_id=task.task_id, chunk=chunk))
                channel.send(TaskDone(task_id=task.task_id))
                if control.shutdown_requested:
                    return
            case Shutdown():
                return
            case CancelTask() | RunnerBootstrap():
                pass  # nothing is running; a late cancel needs no action
