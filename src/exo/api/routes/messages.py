"""The Anthropic Messages API: POST /v1/messages and /v1/messages/count_tokens, errors in Anthropic's shape."""

import time
from uuid import uuid4

from fastapi import APIRouter, Request, Response

from exo.api.adapters.messages_errors import anthropic_error
from exo.api.adapters.messages_request import count_command, to_command
from exo.api.adapters.messages_response import collect_message
from exo.api.adapters.messages_stream import MessageStreamEncoder
from exo.api.adapters.protocol_events import NamedEventWriter
from exo.api.adapters.token_count import collect_prompt_tokens
from exo.api.answer_stream import AnswerStream
from exo.api.completion_flow import CLIENT_CLOSED_REQUEST, collect, served_model, submit
from exo.api.error_shapes import documented_errors, shaped_route
from exo.api.request_log import RequestTimeline
from exo.master.client import MasterClient
from exo.shared.types.anthropic_messages import (
    AnthropicErrorResponse,
    AnthropicMessage,
    CountTokensRequest,
    MessagesRequest,
    TokenCount,
)

# Every path of this protocol starts with this; the request guard answers its refusals in Anthropic's shape too.
MESSAGES_PATH_PREFIX = "/v1/messages"
_ERRORS = documented_errors(AnthropicErrorResponse)


def messages_router(master: MasterClient) -> APIRouter:
    """The Messages API routes in front of `master`."""
    router = APIRouter(route_class=shaped_route(anthropic_error), tags=["Anthropic Messages"])

    @router.post(MESSAGES_PATH_PREFIX, response_model=None, responses=_ERRORS)
    async def create_message(request: MessagesRequest, http_request: Request) -> AnthropicMessage | Response:
        received_at = time.monotonic()
        model_id = served_model(master.state, request.model)
        handle = await submit(master, to_command(request, model_id), http_request)
        timeline = RequestTimeline("messages", model_id, handle.node_id, received_at)
        message_id = f"msg_{uuid4().hex}"
        if not request.stream:
            message = await collect(
                master,
                handle,
                http_request,
                lambda chunks: collect_message(chunks, message_id=message_id, model=model_id),
                timeline,
            )
            return message if message is not None else Response(status_code=CLIENT_CLOSED_REQUEST)
        writer = NamedEventWriter(MessageStreamEncoder(message_id, model_id))
        return AnswerStream(master, handle, writer, timeline, anthropic_error)

    @router.post(f"{MESSAGES_PATH_PREFIX}/count_tokens", response_model=None, responses=_ERRORS)
    async def count_tokens(request: CountTokensRequest, http_request: Request) -> TokenCount | Response:
        """The prompt's tokens, counted by the model's runner with the model's own template and tokenizer."""
        model_id = served_model(master.state, request.model)
        handle = await submit(master, count_command(request, model_id), http_request)
        count = await collect(master, handle, http_request, collect_prompt_tokens)
        return TokenCount(input_tokens=count) if count is not None else Response(status_code=CLIENT_CLOSED_REQUEST)

    return router
