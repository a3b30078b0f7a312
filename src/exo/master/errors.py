"""OpenAI-shaped API errors: `{"error": {"message", "type", "param", "code"}}` with a 4xx/5xx status."""

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from exo.shared.types.api import ErrorBody, ErrorResponse


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


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(status_code=error.status_code, content=error.body.model_dump())


async def handle_api_error(_request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, ApiError)
    return error_response(error)


async def handle_validation_error(_request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError)
    problems = error.errors()
    first = problems[0] if problems else {}
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    message = str(first.get("msg", "invalid request"))
    if first.get("type") == "json_invalid":
        message = f"request body is not valid JSON: {first.get('ctx', {}).get('error', message)}"
    elif location:
        message = f"{'.'.join(location)}: {message}"
    if len(problems) > 1:
        message += f" (and {len(problems) - 1} more problem{'s' if len(problems) > 2 else ''})"
    param = ".".join(location) or None
    return error_response(ApiError(400, message, param=param, code="invalid_request"))


async def handle_http_error(_request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, StarletteHTTPException)
    error_type = "not_found_error" if error.status_code == 404 else "invalid_request_error"
    return error_response(ApiError(error.status_code, str(error.detail), error_type=error_type))
