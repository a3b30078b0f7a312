"""Error layering: the engine and the worker say what went wrong, the API alone decides what it is in HTTP."""

from typing import get_args

import pytest

from exo.api.errors import placement_error, task_error
from exo.shared.errors import ModelNotLoadedError, NoMasterError, QueueFullError, RunnerUnavailableError
from exo.shared.types.chunks import ErrorChunk, TaskErrorKind

# The wire contract each way a task can fail keeps (what clients and SDKs branch on).
TASK_ERROR_WIRE = {
    "context_length_exceeded": (400, "invalid_request_error", "context_length_exceeded"),
    "unsupported": (400, "invalid_request_error", "unsupported"),
    "invalid_request": (400, "invalid_request_error", "invalid_request"),
    "model_unavailable": (503, "server_error", "model_unavailable"),
    "runner_stopped": (503, "server_error", "model_unavailable"),
    "runner_crashed": (500, "server_error", None),
    "node_left": (503, "server_error", "node_left"),
    "dispatch_failed": (500, "server_error", None),
    "generation_failed": (500, "server_error", None),
}


@pytest.mark.parametrize("kind", get_args(TaskErrorKind))
def test_every_task_error_kind_has_its_http_status_type_and_code(kind: TaskErrorKind) -> None:
    error = task_error(ErrorChunk(error=kind, message="what happened", param="top_k"))
    assert (error.status_code, error.body.error.type, error.body.error.code) == TASK_ERROR_WIRE[kind]
    assert error.body.error.message == "what happened"
    assert error.body.error.param == "top_k"


@pytest.mark.parametrize(
    ("raised", "status", "code"),
    [
        (ModelNotLoadedError("m"), 404, "model_not_found"),
        (QueueFullError("64 requests are already waiting"), 429, "queue_full"),
        (RunnerUnavailableError("model m is unavailable"), 503, "model_unavailable"),
        (NoMasterError("no cluster master answered within 30 s"), 503, "no_master"),
    ],
)
def test_placement_errors_map_to_http(raised: Exception, status: int, code: str) -> None:
    error = placement_error(raised)
    assert error is not None
    assert (error.status_code, error.body.error.code) == (status, code)
    assert error.headers == ({} if status == 404 else {"Retry-After": "2" if status == 429 else "5"})


def test_other_exceptions_are_not_placement_errors() -> None:
    assert placement_error(RuntimeError("a bug")) is None
