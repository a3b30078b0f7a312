"""The OpenAI Responses API: POST /v1/responses and /v1/responses/input_tokens (errors in OpenAI's shape)."""

import time
from uuid import uuid4

from fastapi import APIRouter, Request, Response

from exo.api.adapters.protocol_events import NamedEventWriter, sse_event
from exo.api.adapters.responses_request import count_command, to_command
from exo.api.adapters.responses_response import collect_response, initial_response
from exo.api.adapters.responses_stream import ResponseStreamEncoder
from exo.api.adapters.token_count import collect_prompt_tokens
from exo.api.answer_stream import AnswerStream
from exo.api.completion_flow import CLIENT_CLOSED_REQUEST, collect, served_model, submit
from exo.api.error_shapes import documented_errors
from exo.api.errors import openai_error
from exo.api.request_log import RequestTimeline
from exo.master.client import MasterClient
from exo.shared.types.api import ErrorResponse
from exo.shared.types.openai_responses import InputTokensRequest, ResponsesRequest
from exo.shared.types.openai_responses_output import InputTokenCount, ResponseObject

_ERRORS = documented_errors(ErrorResponse)


def responses_router(master: MasterClient) -> APIRouter:
    """The Responses API routes in front of `master`."""
    router = APIRouter(tags=["OpenAI Responses"])

    @router.post("/v1/responses", response_model=None, responses=_ERRORS)
    async def create_response(request: ResponsesRequest, http_request: Request) -> ResponseObject | Response:
        received_at = time.monotonic()
        model_id = served_model(master.state, request.model)
        handle = await submit(master, to_command(request, model_id), http_request)
        timeline = RequestTimeline("responses", model_id, handle.node_id, received_at)
        initial = initial_response(request, f"resp_{uuid4().hex}", model_id)
        if not request.stream:
            response = await collect(
                master, handle, http_request, lambda chunks: collect_response(chunks, initial), timeline
            )
            return response if response is not None else Response(status_code=CLIENT_CLOSED_REQUEST)
        encoder = ResponseStreamEncoder(initial)
        # Codex CLI's idle timer counts only events, not comment lines: the keep-alive is a real event.
        return AnswerStream(
            master,
            handle,
            NamedEventWriter(encoder),
            timeline,
            openai_error,
            keep_alive=lambda _where: [sse_event(encoder.in_progress())],
        )

    @router.post("/v1/responses/input_tokens", response_model=None, responses=_ERRORS)
    async def count_input_tokens(request: InputTokensRequest, http_request: Request) -> InputTokenCount | Response:
        """The prompt's tokens, counted by the model's runner with the model's own template and tokenizer."""
        model_id = served_model(master.state, request.model)
        handle = await submit(master, count_command(request, model_id), http_request)
        count = await collect(master, handle, http_request, collect_prompt_tokens)
        return InputTokenCount(input_tokens=count) if count is not None else Response(status_code=CLIENT_CLOSED_REQUEST)

    return router
