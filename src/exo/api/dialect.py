"""One interface every dialect of the API implements, and the one path every generating request takes through it.

A dialect (chat completions, Messages, Responses, Ollama) says how its request becomes the neutral command
(`command`, an ApiError for what it cannot honour), how the runner's chunks become its answer (`answer`: wire text
a chunk at a time, and the whole body the same chunks add up to) and how an error looks on its wire
(`error_shape`). `serve` does the rest the same way for all of them: pick the served model, submit the command
through the master (with the policy of an `X-Exo-Loop-Guard` header, loop_guard_header.py), then stream the answer
(answer_stream.py) or fold the chunks into the whole body, and log one line for the request (request_log.py).
"""

import time
from typing import Protocol, TypeVar

from fastapi import Request, Response
from pydantic import BaseModel

from exo.api.adapters.protocol_events import AnswerWriter, fold
from exo.api.answer_stream import AnswerStream
from exo.api.completion_flow import (
    CLIENT_CLOSED_REQUEST,
    collect,
    model_description,
    served_once_prepared,
    submit,
)
from exo.api.error_shapes import ErrorShape
from exo.api.loop_guard_header import header_policy, with_header_policy
from exo.api.request_log import RequestTimeline
from exo.master.client import MasterClient
from exo.shared.types.commands import GenerateCommand
from exo.shared.types.common import ModelId
from exo.shared.types.request_record import Dialect as DialectName
from exo.shared.types.state import State
from exo.shared.types.worker.runner_response import ModelDescription

RequestT_contra = TypeVar("RequestT_contra", contravariant=True)


class Dialect(Protocol[RequestT_contra]):
    """What a dialect supplies to `serve` for its generating route."""

    @property
    def name(self) -> DialectName:
        """The dialect's name in the request log and /state."""
        ...

    @property
    def error_shape(self) -> ErrorShape:
        """An ApiError as this dialect's error body."""
        ...

    def served_model(self, state: State, request: RequestT_contra, /) -> ModelId:
        """The served model `request` names (an ApiError when there is none)."""
        ...

    def streams(self, request: RequestT_contra, /) -> bool: ...

    def command(
        self, request: RequestT_contra, model_id: ModelId, metadata: ModelDescription | None, /
    ) -> GenerateCommand:
        """The neutral command for `request` on `model_id` (`metadata`: what its runner reported, once loaded)."""
        ...

    def answer(self, request: RequestT_contra, model_id: ModelId, /) -> AnswerWriter:
        """A fresh answer to `request`."""
        ...


async def serve(
    master: MasterClient, dialect: Dialect[RequestT_contra], request: RequestT_contra, http_request: Request
) -> BaseModel | Response:
    """Generate the answer to `request` in `dialect`: streamed, or whole when the request does not stream."""
    received_at = time.monotonic()
    guard = header_policy(http_request)
    model_id = await served_once_prepared(master, http_request, lambda state: dialect.served_model(state, request))
    command = dialect.command(request, model_id, model_description(master.state, model_id))
    command = with_header_policy(command, guard)
    handle = await submit(master, command, http_request)
    timeline = RequestTimeline(dialect.name, model_id, handle.node_id, received_at)
    answer = dialect.answer(request, model_id)
    if dialect.streams(request):
        return AnswerStream(master, handle, answer, timeline, dialect.error_shape)
    whole = await collect(master, handle, http_request, lambda chunks: fold(chunks, answer), timeline)
    return whole if whole is not None else Response(status_code=CLIENT_CLOSED_REQUEST)
