"""What every generating route does with its command, whatever the wire protocol.

Chat Completions, the Messages API and the Responses API differ only in how they read the request and write the
answer. In between they all: pick the served model (anywhere in the cluster), submit the command through the
master's one entry point (which places it on the node whose runner serves the model), then stream the chunks
(answer_stream.py: headers at admission, keep-alives while the prompt is read) or collect them, cancelling the task
when the client goes away, and log one line for the request (request_log.py).
"""

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final, TypeVar

import anyio
from fastapi import Request

from exo.api.errors import UNAVAILABLE_RETRY_AFTER_SECONDS, ApiError, placement_error
from exo.api.model_availability import unavailable_error
from exo.api.request_log import RequestTimeline
from exo.master.client import MasterClient, TaskHandle
from exo.master.placement import models_in_preparation, served_model_ids
from exo.shared.types.chunks import Chunk
from exo.shared.types.commands import CancelTaskCommand, GenerateCommand
from exo.shared.types.common import ModelId
from exo.shared.types.state import State
from exo.shared.types.worker.runner_response import ModelDescription

logger = logging.getLogger(__name__)

T = TypeVar("T")

# nginx's "client closed request": nobody reads it, but logs and tests see why the request ended.
CLIENT_CLOSED_REQUEST = 499
# A request for a model still being downloaded, imported or loaded waits for it this long (a model ready by then is
# served as if it had been all along, as Ollama does), then gets the 503 `model_loading`. The default model's first
# import takes about a minute on 2 cores; a client sending its first request right after `exo` starts should not
# have to retry.
PREPARING_WAIT_SECONDS: Final = 300.0
_PREPARING_POLL_SECONDS: Final = 0.25
MODEL_LOADING: Final = "model_loading"


def served_model(state: State, requested: str | None) -> ModelId:
    """The model a request names (or the only one served in the cluster), else a 400/404/503 saying why not (503:
    it is being prepared, or the cluster keeps it placed but cannot serve it now)."""
    served = served_model_ids(state)
    if not requested and len(served) == 1:
        return served[0]
    if requested and requested in served:
        return ModelId(requested)
    label = requested or "default"
    preparing = {
        *(label for node in state.nodes.values() if node.health.status != "down" for label in node.preparing),
        *models_in_preparation(state),
    }
    if label in preparing or (not requested and preparing):
        raise ApiError(
            503,
            f"model '{label}' is still being prepared; retry shortly",
            error_type="server_error",
            code=MODEL_LOADING,
            headers={"Retry-After": str(UNAVAILABLE_RETRY_AFTER_SECONDS)},
        )
    only_pending = list(state.pending_placements) if not served and len(state.pending_placements) == 1 else [None]
    unavailable = unavailable_error(state, requested or only_pending[0] or "")
    if unavailable is not None:
        raise unavailable
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


async def served_once_prepared(
    master: MasterClient, http_request: Request, pick: Callable[[State], ModelId]
) -> ModelId:
    """`pick`'s model from the cluster's state, waiting up to PREPARING_WAIT_SECONDS while it says the model is being
    prepared (its 503 `model_loading`), and no longer than the client stays."""
    deadline = time.monotonic() + PREPARING_WAIT_SECONDS
    while True:
        try:
            return pick(master.state)
        except ApiError as error:
            if error.body.error.code != MODEL_LOADING or time.monotonic() >= deadline:
                raise
        if await http_request.is_disconnected():
            raise ApiError(CLIENT_CLOSED_REQUEST, "the client closed the request", code="client_closed_request")
        await anyio.sleep(_PREPARING_POLL_SECONDS)


def model_description(state: State, model_id: ModelId) -> ModelDescription | None:
    """What a runner serving `model_id` reported when it loaded, or while it loads what it read of the model before
    its weights (None before any runner has read it)."""
    runners = [runner for runner in state.runners.values() if runner.model_id == model_id]
    loaded = next((runner.metadata for runner in runners if runner.metadata is not None), None)
    return loaded if loaded is not None else next((r.description for r in runners if r.description is not None), None)


def _check_for_model(command: GenerateCommand, metadata: ModelDescription | None) -> None:
    """400 for what the model itself cannot do with the command, whatever the protocol named it in."""
    top_k = command.params.sampling.top_k
    if metadata is not None and metadata.vocab_size is not None and top_k >= metadata.vocab_size:
        raise ApiError(
            400,
            f"top_k must be below the model's vocabulary size of {metadata.vocab_size} (0: no limit), got {top_k}",
            param="top_k",
        )


async def submit(master: MasterClient, command: GenerateCommand, http_request: Request) -> TaskHandle:
    """Hand `command` to the master (the single entry point for generation, wherever its runner lives).

    A task that cannot start becomes its ApiError; a client that leaves while the task is placed gets 499.
    """
    _check_for_model(command, model_description(master.state, command.model_id))

    async def place() -> TaskHandle:
        try:
            return await master.submit_chat_completion(command)
        except Exception as error:
            refusal = placement_error(error)
            if refusal is None:
                raise
            raise refusal from error

    handle = await unless_client_leaves(http_request, place)
    if handle is None:
        raise ApiError(CLIENT_CLOSED_REQUEST, "the client closed the request", code="client_closed_request")
    return handle


async def unless_client_leaves(http_request: Request, work: Callable[[], Awaitable[T]]) -> T | None:
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


async def collect(
    master: MasterClient,
    handle: TaskHandle,
    http_request: Request,
    collector: Callable[[AsyncIterator[Chunk]], Awaitable[T]],
    timeline: RequestTimeline | None = None,
) -> T | None:
    """The non-streaming answer `collector` builds from every chunk; None if the client left first.

    Nothing is sent before the answer is complete, so a failure keeps its HTTP status (a body sent early, even
    whitespace, would commit the response to 200 and an error could then only arrive as a 200).
    """
    chunks = timeline.tap(handle.chunks) if timeline is not None else handle.chunks

    async def work() -> T:
        try:
            return await collector(chunks)
        except BaseException:
            master.cancel(CancelTaskCommand(task_id=handle.task_id))
            raise

    answer: T | None = None
    try:
        answer = await unless_client_leaves(http_request, work)
    finally:
        if timeline is not None:
            timeline.log(cancelled=answer is None)
            master.record_request(timeline.record(cancelled=answer is None))
    return answer
