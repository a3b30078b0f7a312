"""The runner's end of the pipe to its supervisor: typed messages both ways."""

import json
from multiprocessing.connection import Connection

from pydantic import ValidationError

from exo.shared.types.common import TaskId
from exo.shared.types.worker.runner_response import (
    RunnerRequest,
    RunnerRequestAdapter,
    RunnerResponse,
    RunnerResponseAdapter,
)


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

    def poll(self, timeout: float = 0.0) -> bool:
        """Whether a message is waiting, after waiting up to `timeout` seconds for one."""
        return self._connection.poll(timeout)

    def fileno(self) -> int:
        """The pipe's descriptor: a pipeline rank waits on it together with its task connections."""
        return self._connection.fileno()
