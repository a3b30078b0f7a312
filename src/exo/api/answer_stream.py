"""The streamed answer of a generating route: status and headers at admission, keep-alives until the answer flows.

A request is admitted once a runner's queue took it (on this node or another: a forwarded request's chunks come
over the bus the same way). Its first chunk usually follows within milliseconds (the runner renders the prompt and
says its prefill starts), so the response waits for it up to ADMISSION_WAIT_SECONDS: a request the model refuses
(a prompt too long, a schema the grammar cannot enforce) still gets its 4xx status. Past that wait (the request
queues behind others) the status, the headers and the dialect's opening events go out anyway, and from then on an
error reaches the client as the dialect's error event, followed by the dialect's end of stream.

While nothing else goes out (queued, or a prefill of minutes on a slow machine) a keep-alive is sent every
KEEP_ALIVE_SECONDS, so clients that give up on a silent connection (opencode's header timeout, Claude Code's stream
watchdog, Codex CLI's stream idle timeout) see something arrive. It is an SSE comment line saying where the request
stands (`: queued`, `: prefill 2048/18752 tokens (1024 cached)`), which every SSE parser skips; where a client's
timer counts only events, real events that add nothing to the answer follow it (Messages: an empty text block, then
empty deltas; Responses: `response.in_progress`). Ollama's NDJSON (which has no comments) sends an empty line of the
answer instead. The dialect's writer says which (`keep_alive`).
"""

import contextlib
import logging
import math

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from exo.api.adapters.protocol_events import UNEXPECTED_END, SseWriter, is_final
from exo.api.error_shapes import ErrorShape, shaped_response
from exo.api.errors import task_error
from exo.api.request_log import RequestTimeline
from exo.master.client import MasterClient, TaskHandle
from exo.shared.types.chunks import Chunk, ErrorChunk
from exo.shared.types.commands import CancelTaskCommand

logger = logging.getLogger(__name__)

KEEP_ALIVE_SECONDS = 10.0
"""Longest silence on an admitted stream: a keep-alive goes out after this long without any other byte."""
ADMISSION_WAIT_SECONDS = 1.0
"""How long an admitted request waits for its runner to take it up (and refuse it with a 4xx) before its headers go
out regardless."""

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class AnswerStream(Response):
    """The SSE response for an admitted task; the task is cancelled if the client leaves before the end."""

    media_type = "text/event-stream"

    def __init__(
        self,
        master: MasterClient,
        handle: TaskHandle,
        writer: SseWriter,
        timeline: RequestTimeline,
        error_shape: ErrorShape,
    ) -> None:
        # No body and no content-length: the body is written as the task streams (see __call__).
        self.status_code = 200
        self.background = None
        self.media_type = writer.media_type
        self.init_headers(SSE_HEADERS)
        self._master = master
        self._handle = handle
        self._writer = writer
        self._timeline = timeline
        self._error_shape = error_shape
        self._last_write = 0.0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sender, chunks = anyio.create_memory_object_stream[Chunk](max_buffer_size=math.inf)
        finished = False
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._pump, sender)
                group.start_soon(_cancel_when_client_leaves, receive, group.cancel_scope)
                await self._respond(scope, receive, send, chunks)
                finished = True
                group.cancel_scope.cancel()
        finally:
            if not finished:
                logger.info("client left during task %s; cancelling it", self._handle.task_id)
                self._master.cancel(CancelTaskCommand(task_id=self._handle.task_id))
            self._timeline.log(cancelled=not finished)
            self._master.record_request(self._timeline.record(cancelled=not finished))
            await self._handle.chunks.aclose()

    async def _pump(self, sender: MemoryObjectSendStream[Chunk]) -> None:
        """Move the task's chunks into `sender` (read with timeouts, which would break the chunk generator)."""
        async with sender:
            async for chunk in self._handle.chunks:
                self._timeline.observe(chunk)
                await sender.send(chunk)
                if is_final(chunk):
                    return

    async def _respond(
        self, scope: Scope, receive: Receive, send: Send, chunks: MemoryObjectReceiveStream[Chunk]
    ) -> None:
        first: Chunk | None = None
        with anyio.move_on_after(ADMISSION_WAIT_SECONDS):
            first = await _next_or_end(chunks)
        refusal = task_error(first) if isinstance(first, ErrorChunk) else None
        if refusal is not None and refusal.status_code < 500:
            await shaped_response(self._error_shape, refusal)(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        await self._write(send, self._writer.opening())
        chunk = first
        while True:
            if chunk is None:
                chunk = await self._wait_writing_keep_alives(send, chunks)
            await self._write(send, self._writer.encode(chunk))
            if is_final(chunk):
                break
            chunk = None
        await self._write(send, self._writer.closing())
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _wait_writing_keep_alives(self, send: Send, chunks: MemoryObjectReceiveStream[Chunk]) -> Chunk:
        """The next chunk, with a keep-alive written whenever KEEP_ALIVE_SECONDS pass without a byte sent."""
        while True:
            with anyio.move_on_after(max(self._last_write + KEEP_ALIVE_SECONDS - anyio.current_time(), 0)):
                return await _next_or_end(chunks)
            await self._write(send, self._writer.keep_alive(self._timeline.where()))

    async def _write(self, send: Send, texts: list[str]) -> None:
        for text in texts:
            await send({"type": "http.response.body", "body": text.encode(), "more_body": True})
            self._last_write = anyio.current_time()


async def _next_or_end(chunks: MemoryObjectReceiveStream[Chunk]) -> Chunk:
    """The next chunk; a stream that ends without a final chunk (the runner cancelled it) reads as an error."""
    try:
        return await chunks.receive()
    except anyio.EndOfStream:
        return UNEXPECTED_END


async def _cancel_when_client_leaves(receive: Receive, scope: anyio.CancelScope) -> None:
    with contextlib.suppress(OSError):
        while (await receive())["type"] != "http.disconnect":
            pass
    scope.cancel()
