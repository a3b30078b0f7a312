"""OpenAI-shaped API errors: `{"error": {"message", "type", "param", "code"}}` with a 4xx/5xx status."""

from typing import Final

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from exo.shared.errors import ModelNotLoadedError, NoMasterError, QueueFullError, RunnerUnavailableError
from exo.shared.types.api import ErrorBody, ErrorResponse
from exo.shared.types.chunks import ErrorChunk, TaskErrorKind

# A full queue drains one completion at a time; clients (the OpenAI SDKs honour it) should come back this soon.
QUEUE_FULL_RETRY_AFTER_SECONDS: Final = 2
# A model without a runner now (a node left, a master is being elected): placement is retried every few seconds.
UNAVAILABLE_RETRY_AFTER_SECONDS: Final = 5


class ApiError(Exception):
    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        error_type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.body = ErrorResponse(error=ErrorBody(message=message, type=error_type, param=param, code=code))
        self.headers = headers or {}


# What each way a task can fail is on the wire: (status, OpenAI error type, code).
_TASK_ERRORS: Final[dict[TaskErrorKind, tuple[int, str, str | None]]] = {
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


def task_error(chunk: ErrorChunk) -> ApiError:
    """The HTTP error for a task that failed with `chunk`."""
    status, error_type, code = _TASK_ERRORS[chunk.error]
    return ApiError(status, chunk.message, error_type=error_type, param=chunk.param, code=code)


def placement_error(error: Exception) -> ApiError | None:
    """The HTTP error for an error the master or worker raised while taking a task, or None for any other."""
    match error:
        case ModelNotLoadedError():
            return ApiError(404, f"model '{error}' is not loaded", error_type="not_found_error", code="model_not_found")
        case QueueFullError():
            retry_after = {"Retry-After": str(QUEUE_FULL_RETRY_AFTER_SECONDS)}
            return ApiError(429, str(error), error_type="rate_limit_error", code="queue_full", headers=retry_after)
        case RunnerUnavailableError():
            retry_after = {"Retry-After": str(UNAVAILABLE_RETRY_AFTER_SECONDS)}
            return ApiError(503, str(error), error_type="server_error", code="model_unavailable", headers=retry_after)
        case NoMasterError():
            retry_after = {"Retry-After": str(UNAVAILABLE_RETRY_AFTER_SECONDS)}
            return ApiError(503, str(error), error_type="server_error", code="no_master", headers=retry_after)
        case _:
            return None


def openai_error(error: ApiError) -> ErrorResponse:
    """`error` as OpenAI's error response body."""
    return error.body


def error_response(error: ApiError) -> JSONResponse:
    """The JSON response for `error`, with its headers (Retry-After, WWW-Authenticate)."""
    return JSONResponse(status_code=error.status_code, content=openai_error(error).model_dump(), headers=error.headers)


async def handle_api_error(_request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, ApiError)
    return error_response(error)


def http_error(error: StarletteHTTPException) -> ApiError:
    """Starlette's and FastAPI's own HTTP errors (an unknown path, a body that does not parse) as an ApiError, so every
    protocol answers them with their status in its own shape."""
    if isinstance(error.__cause__, RecursionError):
        # FastAPI's body parser gives up on deep nesting with a generic message; say what the client can fix.
        message = "the request body nests JSON arrays or objects deeper than this server parses"
        return ApiError(error.status_code, message, code="invalid_json")
    error_type = "not_found_error" if error.status_code == 404 else "invalid_request_error"
    headers = dict(error.headers) if error.headers else None
    return ApiError(error.status_code, str(error.detail), error_type=error_type, headers=headers)


async def handle_http_error(_request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, StarletteHTTPException)
    return error_response(http_error(error))


async def handle_unexpected_error(_request: Request, _error: Exception) -> JSONResponse:
    """A bug, not a bad request: answer in OpenAI's error shape (Starlette re-raises it, so uvicorn logs it)."""
    return error_response(ApiError(500, "internal server error", error_type="server_error", code="internal_error"))
