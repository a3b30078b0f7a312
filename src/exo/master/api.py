"""The OpenAI-compatible HTTP API. Thin: validate the request, hand a command to the master, shape the answer."""

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar
from uuid import uuid4

import anyio
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from exo.master.adapters.chat_request import to_command
from exo.master.adapters.chat_response import collect_response
from exo.master.adapters.chat_stream import ChunkEncoder, sse_events
from exo.master.errors import (
    ApiError,
    handle_api_error,
    handle_http_error,
    handle_unexpected_error,
    handle_validation_error,
    placement_error,
    task_error,
)
from exo.master.main import TaskHandle
from exo.master.request_guard import RequestGuard
from exo.node import Node
from exo.shared.types.api import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
)
from exo.shared.types.chunks import Chunk, ErrorChunk
from exo.shared.types.commands import CancelTaskCommand
from exo.shared.types.common import ModelId
from exo.shared.types.state import State
from exo.shared.types.worker.runner_response import ModelMetadata

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Documented in the OpenAPI schema so clients and fuzzers know every failure has OpenAI's error shape.
_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": description}
    for status, description in {
        400: "Invalid request",
        401: "Missing or wrong API key",
        404: "Model not served",
        413: "Request body too large",
        429: "The model's queue is full",
        500: "Server error",
        503: "Model still loading or unavailable",
    }.items()
}
_AUTH_ERRORS: dict[int | str, dict[str, Any]] = {status: _ERRORS[status] for status in (401, 500)}


def create_app(node: Node) -> FastAPI:
    """The FastAPI app serving `node`: /health, /state, /v1/models and /v1/chat/completions."""
    app = FastAPI(title="exo", version="0.1.0")
    app.add_exception_handler(ApiError, handle_api_error)
    app.add_exception_handler(RequestValidationError, handle_validation_error)
    app.add_exception_handler(StarletteHTTPException, handle_http_error)
    app.add_exception_handler(Exception, handle_unexpected_error)
    app.add_middleware(RequestGuard, api_key=node.config.api_key, max_body_bytes=node.config.max_request_bytes)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/state", responses=_AUTH_ERRORS)
    async def state() -> State:
        return node.master.state

    @app.get("/v1/models", responses=_AUTH_ERRORS)
    async def models() -> ModelList:
        cards: list[ModelCard] = []
        for runner in node.master.state.runners.values():
            metadata = runner.metadata
            capabilities = ["chat"]
            if metadata is not None and metadata.tool_format is not None:
                capabilities.append("tool_use")
            if metadata is not None and metadata.supports_reasoning:
                capabilities.append("reasoning")
            cards.append(
                ModelCard(
                    id=runner.model_id,
                    created=int(time.time()),
                    capabilities=capabilities,
                    context_length=metadata.context_length if metadata else None,
                    vocab_size=metadata.vocab_size if metadata else None,
                )
            )
        return ModelList(data=cards)

    @app.post("/v1/chat/completions", response_model=None, responses=_ERRORS)
    async def chat_completions(
        request: ChatCompletionRequest, http_request: Request
    ) -> ChatCompletionResponse | Response:
        model_id = _served_model(node, request.model)
        command = to_command(request, model_id, _metadata(node, model_id))
        try:
            handle = node.master.submit_chat_completion(command)
        except Exception as error:
            refusal = placement_error(error)
            if refusal is None:
                raise
            raise refusal from error
        completion_id = f"chatcmpl-{uuid4().hex}"
        created = int(time.time())
        if not request.stream:
            response = await _unless_client_leaves(
                http_request, lambda: _complete(node, handle, completion_id, created, model_id)
            )
            return response if response is not None else Response(status_code=499)
        first = await _unless_client_leaves(http_request, lambda: _first_chunk(node, handle))
        if first is None:
            await handle.chunks.aclose()
            return Response(status_code=499)
        if isinstance(first, ErrorChunk) and (refusal := task_error(first)).status_code < 500:
            await handle.chunks.aclose()
            raise refusal
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        encoder = ChunkEncoder(completion_id, created, model_id, include_usage)
        return StreamingResponse(
            _cancelling_on_exit(node, handle, sse_events(encoder, first, handle.chunks)),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    return app


def _served_model(node: Node, requested: str | None) -> ModelId:
    model_id = node.resolve_request_model(requested)
    if model_id is not None:
        return model_id
    label = requested or "default"
    if label in node.preparing or (requested is None and node.preparing):
        raise ApiError(503, f"model '{label}' is still being prepared; retry shortly", error_type="server_error")
    served = ", ".join(node.master.model_ids()) or "none"
    if requested is None:
        raise ApiError(400, f"the request names no model and several are served ({served})", param="model")
    raise ApiError(
        404,
        f"model '{requested}' is not served here (served: {served})",
        error_type="not_found_error",
        param="model",
        code="model_not_found",
    )


def _metadata(node: Node, model_id: ModelId) -> ModelMetadata | None:
    """What the runner serving `model_id` reported when it loaded (None while it loads)."""
    runners = node.master.state.runners.values()
    return next((runner.metadata for runner in runners if runner.model_id == model_id and runner.metadata), None)


async def _unless_client_leaves(http_request: Request, work: Callable[[], Awaitable[T]]) -> T | None:
    """Await `work()`, or cancel it and return None if the client disconnects first.

    Until the response starts streaming, nothing else notices a client that gave up: without this a request
    abandoned while it waits in the queue would still run (its cancellation in `work` drops it from the queue).
    """
    result: list[T] = []
    failure: list[Exception] = []
    async with anyio.create_task_group() as group:

        async def watch() -> None:
            while not await http_request.is_disconnected():
                await anyio.sleep(0.1)
            group.cancel_scope.cancel()

        group.start_soon(watch)
        try:
            result.append(await work())
        except Exception as error:  # re-raised below, outside the group, so it is not wrapped in an ExceptionGroup
            failure.append(error)
        group.cancel_scope.cancel()
    if failure:
        raise failure[0]
    return result[0] if result else None


async def _first_chunk(node: Node, handle: TaskHandle) -> Chunk:
    """Wait for the first chunk so request-level errors (context too long…) become proper HTTP errors."""
    try:
        return await anext(handle.chunks)
    except StopAsyncIteration:
        return ErrorChunk(error="generation_failed", message="generation was cancelled before it started")
    except BaseException:
        node.master.cancel(CancelTaskCommand(task_id=handle.task_id))
        raise


async def _complete(
    node: Node, handle: TaskHandle, completion_id: str, created: int, model_id: ModelId
) -> ChatCompletionResponse:
    try:
        return await collect_response(handle.chunks, completion_id=completion_id, created=created, model=model_id)
    except BaseException:
        node.master.cancel(CancelTaskCommand(task_id=handle.task_id))
        raise


async def _cancelling_on_exit(node: Node, handle: TaskHandle, events: AsyncIterator[str]) -> AsyncIterator[str]:
    """If the client goes away mid-stream, tell the runner to stop generating."""
    finished = False
    try:
        async for event in events:
            yield event
        finished = True
    finally:
        if not finished:
            logger.info("client left during task %s; cancelling it", handle.task_id)
            node.master.cancel(CancelTaskCommand(task_id=handle.task_id))
        await handle.chunks.aclose()
