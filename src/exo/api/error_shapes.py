"""Errors in a protocol's own shape: for a router's routes (a route class) and for the request guard before them.

The app-wide handlers answer in OpenAI's shape; another protocol (Anthropic's Messages API) gets the same errors
(the same checks, statuses and messages) in the shape its SDK parses.
"""

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from exo.api.errors import ApiError, http_error
from exo.api.validation_errors import validation_error

logger = logging.getLogger(__name__)

ErrorShape = Callable[[ApiError], BaseModel]

_DOCUMENTED_FAILURES = {
    400: "Invalid request",
    401: "Missing or wrong API key",
    404: "Model not served",
    413: "Request body too large",
    429: "The model's queue is full",
    500: "Server error",
    503: "Model still loading or unavailable",
}


def documented_errors(body: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI `responses` of a generating route: each failure status, its error body's schema being `body`, so
    clients and fuzzers know every failure's shape."""
    return {status: {"model": body, "description": text} for status, text in _DOCUMENTED_FAILURES.items()}


def shaped_route(shape: ErrorShape) -> type[APIRoute]:
    """An APIRoute whose validation errors, ApiErrors and unexpected failures are rendered by `shape`."""

    class ShapedRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def shaped(request: Request) -> Response:
                try:
                    return await handler(request)
                except ApiError as error:
                    return shaped_response(shape, error)
                except RequestValidationError as error:
                    return shaped_response(shape, validation_error(error.errors(), error.body))
                except StarletteHTTPException as error:
                    # FastAPI's own refusals (a body that does not parse) keep their 4xx status in this shape.
                    return shaped_response(shape, http_error(error))
                except Exception:
                    logger.exception("unexpected failure on %s", request.url.path)
                    failure = ApiError(500, "internal server error", error_type="server_error", code="internal_error")
                    return shaped_response(shape, failure)

            return shaped

    return ShapedRoute


def shaped_response(shape: ErrorShape, error: ApiError) -> JSONResponse:
    """The JSON response for `error` in `shape`, with its headers (Retry-After, WWW-Authenticate)."""
    return JSONResponse(status_code=error.status_code, content=shape(error).model_dump(), headers=error.headers)
