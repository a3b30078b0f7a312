"""OpenAI-shaped API errors: `{"error": {"message", "type", "param", "code"}}` with a 4xx/5xx status."""

from collections.abc import Sequence
from typing import Any, Final

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from exo.master.body_text import public_path
from exo.shared.errors import ModelNotLoadedError, NoMasterError, QueueFullError, RunnerUnavailableError
from exo.shared.types.api import ErrorBody, ErrorResponse
from exo.shared.types.chunks import ErrorChunk, TaskErrorKind

# Pydantic names the member of a union it tried inside error locations (`stop.str`, `tool_choice.NamedToolChoice`,
# `stop.constrained-str`, `stop.list[str]`); OpenAI field names are lower snake case, so these parts are recognisable
# and dropped from what the client sees.
_UNION_MEMBER_NAMES = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})
_UNION_MEMBER_PREFIXES = ("constrained-", "function-", "lax-or-strict")


class ApiError(Exception):
    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        error_type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.body = ErrorResponse(error=ErrorBody(message=message, type=error_type, param=param, code=code))


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
            return ApiError(429, str(error), error_type="rate_limit_error", code="queue_full")
        case RunnerUnavailableError():
            return ApiError(503, str(error), error_type="server_error", code="model_unavailable")
        case NoMasterError():
            return ApiError(503, str(error), error_type="server_error", code="no_master")
        case _:
            return None


def error_response(error: ApiError, headers: dict[str, str] | None = None) -> JSONResponse:
    """The JSON response for `error`."""
    return JSONResponse(status_code=error.status_code, content=error.body.model_dump(), headers=headers)


async def handle_api_error(_request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, ApiError)
    return error_response(error)


def _public_location(location: Sequence[int | str]) -> str:
    """`("body", "messages", 0, "role")` → `messages[0].role`, the form our own 400s use."""
    return public_path(
        [
            part
            for part in location
            if isinstance(part, int)
            or not (
                part == "body"
                or part[:1].isupper()
                or "[" in part
                or part in _UNION_MEMBER_NAMES
                or part.startswith(_UNION_MEMBER_PREFIXES)
            )
        ]
    )


def validation_error(problems: Sequence[Any]) -> ApiError:
    """Turn pydantic/FastAPI validation problems into one 400 naming the first bad field (or every unknown one)."""
    unknown = [_public_location(problem["loc"]) for problem in problems if problem.get("type") == "extra_forbidden"]
    if unknown:
        plural = "s" if len(unknown) > 1 else ""
        return ApiError(
            400,
            f"Unrecognized request argument{plural} supplied: {', '.join(unknown)}",
            param=unknown[0],
            code="unknown_parameter",
        )
    # A union reports one problem per member it tried; "should be a valid string" for a list says least, so a
    # member's own complaint (too long, out of range) is named first.
    first = next((problem for problem in problems if not _is_type_mismatch(problem)), problems[0] if problems else {})
    location = _public_location(first.get("loc", ()))
    message = str(first.get("msg", "invalid request"))
    problem_type = first.get("type")
    if problem_type == "json_invalid":
        message = f"request body is not valid JSON: {first.get('ctx', {}).get('error', message)}"
    elif not location and problem_type == "missing":
        message = "the request body is empty; send a JSON object"
    elif not location and problem_type in ("model_attributes_type", "dict_type"):
        # FastAPI hands over raw bytes when the Content-Type is not JSON (curl -d sends a form type).
        message = "the request body must be a JSON object sent with Content-Type: application/json"
    elif location:
        message = f"{location}: {message}"
    if len(problems) > 1:
        message += f" (and {len(problems) - 1} more problem{'s' if len(problems) > 2 else ''})"
    return ApiError(400, message, param=location or None, code="invalid_request")


def _is_type_mismatch(problem: Any) -> bool:
    problem_type = str(problem.get("type", ""))
    return problem_type.endswith("_type") or problem_type in ("model_attributes_type", "union_tag_invalid")


async def handle_validation_error(_request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError)
    return error_response(validation_error(error.errors()))


async def handle_http_error(_request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, StarletteHTTPException)
    error_type = "not_found_error" if error.status_code == 404 else "invalid_request_error"
    return error_response(ApiError(error.status_code, str(error.detail), error_type=error_type))


async def handle_unexpected_error(_request: Request, _error: Exception) -> JSONResponse:
    """A bug, not a bad request: answer in OpenAI's error shape (Starlette re-raises it, so uvicorn logs it)."""
    return error_response(ApiError(500, "internal server error", error_type="server_error", code="internal_error"))
