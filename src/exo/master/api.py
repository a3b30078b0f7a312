"""The OpenAI-compatible HTTP API. Thin: validate the request, hand a command to the master, shape the answer."""

import time
from typing import Any
from uuid import uuid4

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from exo.master.adapters.chat_request import to_command
from exo.master.adapters.chat_response import collect_response
from exo.master.adapters.chat_stream import ChunkEncoder, sse_events
from exo.master.adapters.messages_errors import anthropic_error
from exo.master.completion_flow import (
    CLIENT_CLOSED_REQUEST,
    collect,
    event_stream,
    first_chunk,
    served_model,
    submit,
)
from exo.master.errors import (
    ApiError,
    handle_api_error,
    handle_http_error,
    handle_unexpected_error,
    handle_validation_error,
)
from exo.master.request_guard import RequestGuard
from exo.master.routes.catalog import catalog_router
from exo.master.routes.messages import MESSAGES_PATH_PREFIX, messages_router
from exo.master.routes.responses import responses_router
from exo.mcp.http_mount import mount_mcp
from exo.node import Node
from exo.shared.types.api import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
)
from exo.shared.types.state import State

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
    """The FastAPI app serving `node`: /health, /state, /v1/models, chat completions, Messages and Responses."""
    app = FastAPI(title="exo", version="0.1.0")
    app.add_exception_handler(ApiError, handle_api_error)
    app.add_exception_handler(RequestValidationError, handle_validation_error)
    app.add_exception_handler(StarletteHTTPException, handle_http_error)
    app.add_exception_handler(Exception, handle_unexpected_error)
    app.add_middleware(
        RequestGuard,
        api_key=node.config.api_key,
        max_body_bytes=node.config.max_request_bytes,
        error_shapes={MESSAGES_PATH_PREFIX: anthropic_error},
    )
    mount_mcp(app, host=node.config.host, port=node.config.api_port, api_key=node.config.api_key)

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
        model_id = served_model(node, request.model)
        handle = submit(node, to_command(request, model_id))
        completion_id = f"chatcmpl-{uuid4().hex}"
        created = int(time.time())
        if not request.stream:
            response = await collect(
                node,
                handle,
                http_request,
                lambda chunks: collect_response(chunks, completion_id=completion_id, created=created, model=model_id),
            )
            return response if response is not None else Response(status_code=CLIENT_CLOSED_REQUEST)
        first = await first_chunk(node, handle, http_request)
        if first is None:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        encoder = ChunkEncoder(completion_id, created, model_id, include_usage)
        return event_stream(node, handle, sse_events(encoder, first, handle.chunks))

    app.include_router(messages_router(node))
    app.include_router(responses_router(node))
    app.include_router(catalog_router(node))
    return app
