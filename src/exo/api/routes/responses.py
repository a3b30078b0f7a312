"""The OpenAI Responses API: POST /v1/responses and /v1/responses/input_tokens (errors in OpenAI's shape)."""

from dataclasses import dataclass
from uuid import uuid4

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from exo.api.adapters.protocol_events import AnswerWriter, NamedEventWriter
from exo.api.adapters.responses_request import count_command, to_command
from exo.api.adapters.responses_response import initial_response
from exo.api.adapters.responses_stream import ResponseStreamEncoder
from exo.api.adapters.token_count import collect_prompt_tokens
from exo.api.completion_flow import CLIENT_CLOSED_REQUEST, collect, served_model, served_once_prepared, submit
from exo.api.dialect import serve
from exo.api.error_shapes import ErrorShape, documented_errors
from exo.api.errors import openai_error
from exo.api.types.openai_responses import InputTokensRequest, ResponsesRequest
from exo.api.types.openai_responses_output import InputTokenCount
from exo.master.client import MasterClient
from exo.shared.types.api import ErrorResponse
from exo.shared.types.commands import GenerateCommand
from exo.shared.types.common import ModelId
from exo.shared.types.request_record import Dialect as DialectName
from exo.shared.types.state import State
from exo.shared.types.worker.runner_response import ModelDescription

_ERRORS = documented_errors(ErrorResponse)


@dataclass(frozen=True)
class Responses:
    """The Responses API as a dialect: input items in, `response.*` events or one response object out."""

    name: DialectName = "responses"
    error_shape: ErrorShape = openai_error

    def served_model(self, state: State, request: ResponsesRequest) -> ModelId:
        return served_model(state, request.model)

    def streams(self, request: ResponsesRequest) -> bool:
        return request.stream is True

    def command(
        self, request: ResponsesRequest, model_id: ModelId, _metadata: ModelDescription | None
    ) -> GenerateCommand:
        return to_command(request, model_id)

    def answer(self, request: ResponsesRequest, model_id: ModelId) -> AnswerWriter:
        encoder = ResponseStreamEncoder(initial_response(request, f"resp_{uuid4().hex}", model_id))
        # Codex CLI's idle timer counts only events, not comment lines: the keep-alive is a real event.
        return NamedEventWriter(encoder, keep_alive_events=encoder.keep_alive)


def responses_router(master: MasterClient) -> APIRouter:
    """The Responses API routes in front of `master`."""
    router = APIRouter(tags=["OpenAI Responses"])
    dialect = Responses()

    @router.post("/v1/responses", response_model=None, responses=_ERRORS)
    async def create_response(request: ResponsesRequest, http_request: Request) -> BaseModel | Response:
        return await serve(master, dialect, request, http_request)

    @router.post("/v1/responses/input_tokens", response_model=None, responses=_ERRORS)
    async def count_input_tokens(request: InputTokensRequest, http_request: Request) -> InputTokenCount | Response:
        """The prompt's tokens, counted by the model's runner with the model's own template and tokenizer."""
        model_id = await served_once_prepared(master, http_request, lambda state: served_model(state, request.model))
        handle = await submit(master, count_command(request, model_id), http_request)
        count = await collect(master, handle, http_request, collect_prompt_tokens)
        return InputTokenCount(input_tokens=count) if count is not None else Response(status_code=CLIENT_CLOSED_REQUEST)

    return router
