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

from exo.master.errors import ApiError, validation_error

logger = logging.getLogger(__name__)

ErrorShape = Callable[[ApiError], BaseModel]


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
                    return shaped_response(shape, validation_error(error.errors()))
                except Exception:
                    logger.exception("unexpected failure on %s", request.url.path)
                    failure = ApiError(500, "internal server error", error_type="server_error", code="internal_error")
                    return shaped_response(shape, failure)

            return shaped

    return ShapedRoute


def shaped_response(shape: ErrorShape, error: ApiError, headers: dict[str, str] | None = None) -> JSONResponse:
    """The JSON response for `error` in `shape`."""
    return JSONResponse(status_code=error.status_code, content=shape(error).model_dump(), headers=headers)
