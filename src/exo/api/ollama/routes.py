"""Ollama's API: /api/chat, /api/generate (NDJSON streams or one object), /api/tags, /api/show, /api/ps,
/api/version; every failure as Ollama's `{"error": "…"}` with its status."""

from dataclasses import dataclass

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from exo.api.adapters.protocol_events import AnswerWriter
from exo.api.completion_flow import served_once_prepared
from exo.api.dialect import serve
from exo.api.error_shapes import ErrorShape, documented_errors, shaped_route
from exo.api.errors import ApiError
from exo.api.ollama.answer import NdjsonWriter, OllamaAnswer, created_at
from exo.api.ollama.models import OLLAMA_API_VERSION, loaded, served_ollama_model, show, tags
from exo.api.ollama.request import chat_command, generate_command
from exo.api.types.ollama import (
    OllamaChatRequest,
    OllamaError,
    OllamaGenerateRequest,
    OllamaLoaded,
    OllamaModelList,
    OllamaShowAnswer,
    OllamaShowRequest,
    OllamaVersion,
)
from exo.master.client import MasterClient
from exo.shared.types.commands import GenerateCommand
from exo.shared.types.common import ModelId
from exo.shared.types.request_record import Dialect as DialectName
from exo.shared.types.state import State
from exo.shared.types.worker.runner_response import ModelDescription

# Every path of Ollama's API starts with this; the request guard answers its refusals in Ollama's shape too.
OLLAMA_PATH_PREFIX = "/api/"
_ERRORS = documented_errors(OllamaError)


def ollama_error(error: ApiError) -> OllamaError:
    """`error` as Ollama's error body: the message alone (its clients show it as is)."""
    return OllamaError(error=error.body.error.message)


def _context_length(metadata: ModelDescription | None) -> int | None:
    return metadata.context_length if metadata else None


@dataclass(frozen=True)
class OllamaChat:
    """/api/chat as a dialect: Ollama's messages in, NDJSON chat lines or one chat object out."""

    name: DialectName = "ollama.chat"
    error_shape: ErrorShape = ollama_error

    def served_model(self, state: State, request: OllamaChatRequest) -> ModelId:
        return served_ollama_model(state, request.model)

    def streams(self, request: OllamaChatRequest) -> bool:
        return request.stream

    def command(
        self, request: OllamaChatRequest, model_id: ModelId, metadata: ModelDescription | None
    ) -> GenerateCommand:
        return chat_command(request, model_id, _context_length(metadata))

    def answer(self, _request: OllamaChatRequest, model_id: ModelId) -> AnswerWriter:
        return NdjsonWriter(OllamaAnswer(model_id, "chat"))


@dataclass(frozen=True)
class OllamaGenerate:
    """/api/generate as a dialect: one prompt in, NDJSON `response` lines or one object out."""

    name: DialectName = "ollama.generate"
    error_shape: ErrorShape = ollama_error

    def served_model(self, state: State, request: OllamaGenerateRequest) -> ModelId:
        return served_ollama_model(state, request.model)

    def streams(self, request: OllamaGenerateRequest) -> bool:
        return request.stream

    def command(
        self, request: OllamaGenerateRequest, model_id: ModelId, metadata: ModelDescription | None
    ) -> GenerateCommand:
        return generate_command(request, model_id, _context_length(metadata))

    def answer(self, _request: OllamaGenerateRequest, model_id: ModelId) -> AnswerWriter:
        return NdjsonWriter(OllamaAnswer(model_id, "generate"))


def ollama_router(master: MasterClient) -> APIRouter:
    """Ollama's API routes in front of `master`."""
    router = APIRouter(route_class=shaped_route(ollama_error), tags=["Ollama"])
    chat_dialect, generate_dialect = OllamaChat(), OllamaGenerate()

    @router.post("/api/chat", response_model=None, responses=_ERRORS)
    async def chat(request: OllamaChatRequest, http_request: Request) -> BaseModel | Response:
        return await serve(master, chat_dialect, request, http_request)

    @router.post("/api/generate", response_model=None, responses=_ERRORS)
    async def generate(request: OllamaGenerateRequest, http_request: Request) -> BaseModel | Response:
        if not request.prompt and not request.system:
            # Ollama answers an empty prompt by loading the model: here, once the model is ready.
            model_id = await served_once_prepared(
                master, http_request, lambda state: served_ollama_model(state, request.model)
            )
            return OllamaLoaded(model=model_id, created_at=created_at())
        return await serve(master, generate_dialect, request, http_request)

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
