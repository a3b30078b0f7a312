"""Ollama's API: /api/chat, /api/generate (NDJSON streams or one object), /api/tags, /api/show, /api/ps,
/api/version; every failure as Ollama's `{"error": "…"}` with its status."""

import time
from collections.abc import Callable

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from exo.api.answer_stream import AnswerStream
from exo.api.completion_flow import CLIENT_CLOSED_REQUEST, collect, model_metadata, submit
from exo.api.error_shapes import documented_errors, shaped_route
from exo.api.errors import ApiError
from exo.api.ollama.answer import AnswerKind, NdjsonWriter, OllamaAnswer, collect_answer, created_at
from exo.api.ollama.models import OLLAMA_API_VERSION, loaded, served_ollama_model, show, tags
from exo.api.ollama.request import chat_command, generate_command
from exo.api.ollama.wire import (
    OllamaChatRequest,
    OllamaError,
    OllamaGenerateRequest,
    OllamaLoaded,
    OllamaModelList,
    OllamaShowAnswer,
    OllamaShowRequest,
    OllamaVersion,
)
from exo.api.request_log import RequestTimeline
from exo.master.client import MasterClient
from exo.shared.types.commands import ChatCompletionCommand
from exo.shared.types.common import ModelId

# Every path of Ollama's API starts with this; the request guard answers its refusals in Ollama's shape too.
OLLAMA_PATH_PREFIX = "/api/"
_ERRORS = documented_errors(OllamaError)


def ollama_error(error: ApiError) -> OllamaError:
    """`error` as Ollama's error body: the message alone (its clients show it as is)."""
    return OllamaError(error=error.body.error.message)


def ollama_router(master: MasterClient) -> APIRouter:
    """Ollama's API routes in front of `master`."""
    router = APIRouter(route_class=shaped_route(ollama_error), tags=["Ollama"])

    async def answer(
        kind: AnswerKind,
        requested: str,
        stream: bool,
        command_for: Callable[[ModelId, int | None], ChatCompletionCommand],
        http_request: Request,
    ) -> BaseModel | Response:
        received_at = time.monotonic()
        model_id = served_ollama_model(master.state, requested)
        metadata = model_metadata(master.state, model_id)
        command = command_for(model_id, metadata.context_length if metadata else None)
        handle = await submit(master, command, http_request)
        timeline = RequestTimeline(
            "ollama.chat" if kind == "chat" else "ollama.generate", model_id, handle.node_id, received_at
        )
        ollama_answer = OllamaAnswer(model_id, kind)
        if not stream:
            whole = await collect(
                master, handle, http_request, lambda chunks: collect_answer(chunks, ollama_answer), timeline
            )
            return whole if whole is not None else Response(status_code=CLIENT_CLOSED_REQUEST)
        writer = NdjsonWriter(ollama_answer)
        return AnswerStream(
            master,
            handle,
            writer,
            timeline,
            ollama_error,
            media_type=NdjsonWriter.media_type,
            keep_alive=writer.keep_alive,
        )

    @router.post("/api/chat", response_model=None, responses=_ERRORS)
    async def chat(request: OllamaChatRequest, http_request: Request) -> BaseModel | Response:
        def command(model_id: ModelId, context_length: int | None) -> ChatCompletionCommand:
            return chat_command(request, model_id, context_length)

        return await answer("chat", request.model, request.stream, command, http_request)

    @router.post("/api/generate", response_model=None, responses=_ERRORS)
    async def generate(request: OllamaGenerateRequest, http_request: Request) -> BaseModel | Response:
        if not request.prompt and not request.system:
            # Ollama answers an empty prompt by loading the model; exo's served models are loaded already.
            model_id = served_ollama_model(master.state, request.model)
            return OllamaLoaded(model=model_id, created_at=created_at())

        def command(model_id: ModelId, context_length: int | None) -> ChatCompletionCommand:
            return generate_command(request, model_id, context_length)

        return await answer("generate", request.model, request.stream, command, http_request)

    @router.get("/api/tags", responses=_ERRORS)
    async def list_models() -> OllamaModelList:
        return tags(master.state)

    @router.get("/api/ps", responses=_ERRORS)
    async def running_models() -> OllamaModelList:
        return loaded(master.state)

    @router.post("/api/show", responses=_ERRORS)
    async def show_model(request: OllamaShowRequest) -> OllamaShowAnswer:
        return show(master.state, served_ollama_model(master.state, request.name or request.model))

    @router.get("/api/version", responses=_ERRORS)
    async def version() -> OllamaVersion:
        return OllamaVersion(version=OLLAMA_API_VERSION)

    return router
