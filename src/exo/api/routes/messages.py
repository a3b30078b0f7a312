"""The Anthropic Messages API: POST /v1/messages and /v1/messages/count_tokens, errors in Anthropic's shape."""

from dataclasses import dataclass
from uuid import uuid4

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from exo.api.adapters.messages_errors import anthropic_error
from exo.api.adapters.messages_request import count_command, to_command
from exo.api.adapters.messages_stream import MessageStreamEncoder
from exo.api.adapters.protocol_events import AnswerWriter, NamedEventWriter
from exo.api.adapters.token_count import collect_prompt_tokens
from exo.api.completion_flow import CLIENT_CLOSED_REQUEST, collect, served_model, served_once_prepared, submit
from exo.api.dialect import serve
from exo.api.error_shapes import ErrorShape, documented_errors, shaped_route
from exo.api.types.anthropic_messages import (
    AnthropicErrorResponse,
    CountTokensRequest,
    MessagesRequest,
    TokenCount,
)
from exo.master.client import MasterClient
from exo.shared.types.commands import GenerateCommand
from exo.shared.types.common import ModelId
from exo.shared.types.request_record import Dialect as DialectName
from exo.shared.types.state import State
from exo.shared.types.worker.runner_response import ModelDescription

# Every path of this protocol starts with this; the request guard answers its refusals in Anthropic's shape too.
MESSAGES_PATH_PREFIX = "/v1/messages"
_ERRORS = documented_errors(AnthropicErrorResponse)


@dataclass(frozen=True)
class Messages:
    """The Messages API as a dialect: content blocks in, Anthropic's stream events or one message out."""

    name: DialectName = "messages"
    error_shape: ErrorShape = anthropic_error

    def served_model(self, state: State, request: MessagesRequest) -> ModelId:
        return served_model(state, request.model)

    def streams(self, request: MessagesRequest) -> bool:
        return request.stream

    def command(
        self, request: MessagesRequest, model_id: ModelId, _metadata: ModelDescription | None
    ) -> GenerateCommand:
        return to_command(request, model_id)

    def answer(self, _request: MessagesRequest, model_id: ModelId) -> AnswerWriter:
        encoder = MessageStreamEncoder(f"msg_{uuid4().hex}", model_id)
        # Claude Code's stream watchdog counts only events other than `ping`: the keep-alive is content events.
        return NamedEventWriter(encoder, keep_alive_events=encoder.keep_alive)


def messages_router(master: MasterClient) -> APIRouter:
    """The Messages API routes in front of `master`."""
    router = APIRouter(route_class=shaped_route(anthropic_error), tags=["Anthropic Messages"])
    dialect = Messages()

    @router.post(MESSAGES_PATH_PREFIX, response_model=None, responses=_ERRORS)
    async def create_message(request: MessagesRequest, http_request: Request) -> BaseModel | Response:
        return await serve(master, dialect, request, http_request)

    @router.post(f"{MESSAGES_PATH_PREFIX}/count_tokens", response_model=None, responses=_ERRORS)
    async def count_tokens(request: CountTokensRequest, http_request: Request) -> TokenCount | Response:
        """The prompt's tokens, counted by the model's runner with the model's own template and tokenizer."""
        model_id = await served_once_prepared(master, http_request, lambda state: served_model(state, request.model))
        handle = await submit(master, count_command(request, model_id), http_request)
        count = await collect(master, handle, http_request, collect_prompt_tokens)
        return TokenCount(input_tokens=count) if count is not None else Response(status_code=CLIENT_CLOSED_REQUEST)

    return router
