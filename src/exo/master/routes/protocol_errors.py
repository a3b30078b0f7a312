"""A route class that answers every failure of its routes in a protocol's own error shape."""

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
    """An APIRoute whose validation errors, ApiErrors and unexpected failures are rendered by `shape`.

    The app-wide handlers answer in OpenAI's shape; a router for another protocol uses this class instead, so the
    same errors (the same checks, statuses and messages) reach its clients in the shape their SDK parses.
    """

    class ShapedRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def shaped(request: Request) -> Response:
                try:
                    return await handler(request)
                except ApiError as error:
                    return _render(shape, error)
                except RequestValidationError as error:
                    return _render(shape, validation_error(error.errors()))
                except Exception:
                    logger.exception("unexpected failure on %s", request.url.path)
                    failure = ApiError(500, "internal server error", error_type="server_error", code="internal_error")
                    return _render(shape, failure)

            return shaped

    return ShapedRoute


def _render(shape: ErrorShape, error: ApiError) -> JSONResponse:
    return JSONResponse(status_code=error.status_code, content=shape(error).model_dump())
