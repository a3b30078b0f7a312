"""The OpenAI-compatible HTTP API. Thin: validate the request, hand a command to the master, shape the answer.

Every node serves it; a request for a model whose runner lives on another node is forwarded there by the master
and streamed back unchanged. The cluster's own endpoints (/v1/cluster…, /metrics) are in cluster_routes.py.
"""

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
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
from exo.master.client import MasterClient, TaskHandle, TaskRefusedError
from exo.master.cluster_routes import cluster_router
from exo.master.errors import (
    ApiError,
    handle_api_error,
    handle_http_error,
    handle_unexpected_error,
    handle_validation_error,
)
from exo.master.placement import served_model_ids
from exo.master.request_guard import RequestGuard
from exo.shared.types.api import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
)
from exo.shared.types.chunks import Chunk, ErrorChunk
from exo.shared.types.commands import CancelTaskCommand, ChatCompletionCommand
from exo.shared.types.common import ModelId
from exo.shared.types.state import RunnerInfo, State

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


@dataclass(frozen=True)
class ApiSettings:
    api_key: str | None = None
    max_request_bytes: int = 32 * 1024 * 1024


def create_app(master: MasterClient, settings: ApiSettings) -> FastAPI:
    """The FastAPI app in front of `master`: /health, /state, /v1/models, /v1/chat/completions and the cluster's
    endpoints."""
    app = FastAPI(title="exo", version="0.1.0")
    app.add_exception_handler(ApiError, handle_api_error)
    app.add_exception_handler(RequestValidationError, handle_validation_error)
    app.add_exception_handler(StarletteHTTPException, handle_http_error)
    app.add_exception_handler(Exception, handle_unexpected_error)
    app.add_middleware(RequestGuard, api_key=settings.api_key, max_body_bytes=settings.max_request_bytes)
    app.include_router(cluster_router(master))

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/state", responses=_AUTH_ERRORS)
    async def state() -> State:
        return master.state

    @app.get("/v1/models", responses=_AUTH_ERRORS)
    async def models() -> ModelList:
        return ModelList(data=_model_cards(master.state))

    @app.post("/v1/chat/completions", response_model=None, responses=_ERRORS)
    async def chat_completions(
        request: ChatCompletionRequest, http_request: Request
    ) -> ChatCompletionResponse | Response:
        model_id = _served_model(master.state, request.model)
        command = to_command(request, model_id)
        handle = await _unless_client_leaves(http_request, lambda: _submit(master, command))
        if handle is None:
            return Response(status_code=499)
        completion_id = f"chatcmpl-{uuid4().hex}"
        created = int(time.time())
        if not request.stream:
            response = await _unless_client_leaves(
                http_request, lambda: _complete(master, handle, completion_id, created, model_id)
            )
            return response if response is not None else Response(status_code=499)
        first = await _unless_client_leaves(http_request, lambda: _first_chunk(master, handle))
        if first is None:
            await handle.chunks.aclose()
            return Response(status_code=499)
        if isinstance(first, ErrorChunk) and first.status_code < 500:
            await handle.chunks.aclose()
            raise ApiError(first.status_code, first.message, error_type=first.error_type, code=first.code)
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        encoder = ChunkEncoder(completion_id, created, model_id, include_usage)
        return StreamingResponse(
            _cancelling_on_exit(master, handle, sse_events(encoder, first, handle.chunks)),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    return app


def _model_cards(state: State) -> list[ModelCard]:
    """One card per model served anywhere in the cluster (described by a ready runner when there is one)."""
    described: dict[ModelId, RunnerInfo] = {}
    for runner in state.runners.values():
        if runner.model_id in served_model_ids(state):
            known = described.get(runner.model_id)
            if known is None or (known.metadata is None and runner.metadata is not None):
                described[runner.model_id] = runner
    cards: list[ModelCard] = []
    for model_id, runner in sorted(described.items()):
        metadata = runner.metadata
        capabilities = ["chat"]
        if metadata is not None and metadata.tool_format is not None:
            capabilities.append("tool_use")
        if metadata is not None and metadata.supports_reasoning:
            capabilities.append("reasoning")
        cards.append(
            ModelCard(
                id=model_id,
                created=int(time.time()),
                capabilities=capabilities,
                context_length=metadata.context_length if metadata else None,
            )
        )
    return cards


def _served_model(state: State, requested: str | None) -> ModelId:
    """The model a request names (or the only one served, when it names none), or the error saying why not."""
    served = served_model_ids(state)
    if not requested and len(served) == 1:
        return served[0]
    if requested and requested in served:
        return ModelId(requested)
    label = requested or "default"
    preparing = {
        preparation.model
        for node in state.nodes.values()
        if node.health.status != "down"
        for preparation in node.preparing
    }
    if label in preparing or (not requested and preparing):
        raise ApiError(503, f"model '{label}' is still being prepared; retry shortly", error_type="server_error")
    served_text = ", ".join(served) or "none"
    if not requested:
        raise ApiError(400, f"the request names no model and several are served ({served_text})", param="model")
    raise ApiError(
        404,
        f"model '{requested}' is not served here (served: {served_text})",
        error_type="not_found_error",
        param="model",
        code="model_not_found",
    )


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


# How each refusal reaches the client: (HTTP status, OpenAI error type, code).
_REFUSALS: dict[str, tuple[int, str, str]] = {
    "queue_full": (429, "rate_limit_error", "queue_full"),
    "model_unavailable": (503, "server_error", "model_unavailable"),
    "model_not_found": (404, "not_found_error", "model_not_found"),
    "no_master": (503, "server_error", "no_master"),
}


async def _submit(master: MasterClient, command: ChatCompletionCommand) -> TaskHandle:
    """Hand the command to the master; a task that cannot start becomes its HTTP error."""
    try:
        return await master.submit_chat_completion(command)
    except TaskRefusedError as error:
        status, error_type, code = _REFUSALS[error.reason]
        raise ApiError(status, str(error), error_type=error_type, code=code) from error


async def _first_chunk(master: MasterClient, handle: TaskHandle) -> Chunk:
    """Wait for the first chunk so request-level errors (context too long…) become proper HTTP errors."""
    try:
        return await anext(handle.chunks)
    except StopAsyncIteration:
        return ErrorChunk(message="generation was cancelled before it started", status_code=500)
    except BaseException:
        master.cancel(CancelTaskCommand(task_id=handle.task_id))
        raise


async def _complete(
    master: MasterClient, handle: TaskHandle, completion_id: str, created: int, model_id: ModelId
) -> ChatCompletionResponse:
    try:
        return await collect_response(handle.chunks, completion_id=completion_id, created=created, model=model_id)
    except BaseException:
        master.cancel(CancelTaskCommand(task_id=handle.task_id))
        raise


async def _cancelling_on_exit(
    master: MasterClient, handle: TaskHandle, events: AsyncIterator[str]
) -> AsyncIterator[str]:
    """If the client goes away mid-stream, tell the runner to stop generating."""
    finished = False
    try:
        async for event in events:
            yield event
        finished = True
    finally:
        if not finished:
            logger.info("client left during task %s; cancelling it", handle.task_id)
            master.cancel(CancelTaskCommand(task_id=handle.task_id))
        await handle.chunks.aclose()
