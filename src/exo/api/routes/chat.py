"""OpenAI Chat Completions: POST /v1/chat/completions (errors in OpenAI's shape)."""

import time
from dataclasses import dataclass
from uuid import uuid4

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from exo.api.adapters.chat_request import to_command
from exo.api.adapters.chat_stream import ChatEventWriter, ChunkEncoder
from exo.api.adapters.protocol_events import AnswerWriter
from exo.api.completion_flow import served_model
from exo.api.dialect import serve
from exo.api.error_shapes import ErrorShape, documented_errors
from exo.api.errors import openai_error
from exo.api.types.openai_chat import ChatCompletionRequest
from exo.master.client import MasterClient
from exo.shared.types.api import ErrorResponse
from exo.shared.types.commands import GenerateCommand
from exo.shared.types.common import ModelId
from exo.shared.types.request_record import Dialect as DialectName
from exo.shared.types.state import State
from exo.shared.types.worker.runner_response import ModelDescription

_ERRORS = documented_errors(ErrorResponse)


@dataclass(frozen=True)
class ChatCompletions:
    """Chat completions as a dialect: the request as is, `chat.completion.chunk` events or one `chat.completion`."""

    name: DialectName = "chat.completions"
    error_shape: ErrorShape = openai_error

    def served_model(self, state: State, request: ChatCompletionRequest) -> ModelId:
        return served_model(state, request.model)

    def streams(self, request: ChatCompletionRequest) -> bool:
        return request.stream

    def command(
        self, request: ChatCompletionRequest, model_id: ModelId, _metadata: ModelDescription | None
    ) -> GenerateCommand:
        return to_command(request, model_id)

    def answer(self, request: ChatCompletionRequest, model_id: ModelId) -> AnswerWriter:
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        encoder = ChunkEncoder(f"chatcmpl-{uuid4().hex}", int(time.time()), model_id, include_usage)
        return ChatEventWriter(encoder)


def chat_router(master: MasterClient) -> APIRouter:
    """The chat completions route in front of `master`."""
    router = APIRouter(tags=["OpenAI Chat Completions"])
    dialect = ChatCompletions()

    @router.post("/v1/chat/completions", response_model=None, responses=_ERRORS)
    async def chat_completions(request: ChatCompletionRequest, http_request: Request) -> BaseModel | Response:
        return await serve(master, dialect, request, http_request)

    return router
