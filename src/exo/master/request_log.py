"""One INFO line per generating request, written by the node whose API took it: what was asked, who served it,
where the time went and how it ended. `-q` (warnings only) hides it. For example:

    request messages model=qwen2.5-coder-0.5b-instruct node=b8e131f05fb80bac7488e2d423d4fe44 prompt=18752
    cached=16384 (disk 0) queue=0.01s prefill=41.30s ttft=41.32s output=87 decode=6.1 tok/s finish=tool_calls

`cached` is what the prefix cache gave (memory and disk together, then the disk part); `queue` runs from the
request's arrival to the start of its prefill, `ttft` to its first output.
"""

import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Literal

from exo.shared.types.chunks import Chunk, ErrorChunk, FinishChunk, PrefillProgressChunk
from exo.shared.types.common import ModelId, NodeId

logger = logging.getLogger(__name__)

Dialect = Literal["chat.completions", "messages", "responses"]


class RequestTimeline:
    """What one request's chunks said, and when: the request's log line and its keep-alive comments."""

    def __init__(
        self,
        dialect: Dialect,
        model_id: ModelId,
        node_id: NodeId,
        received_at: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._dialect = dialect
        self._model_id = model_id
        self._node_id = node_id
        self._clock = clock
        self._received_at = received_at
        self._progress: PrefillProgressChunk | None = None
        self._prefill_started_at: float | None = None
        self._prefill_ended_at: float | None = None
        self._first_output_at: float | None = None
        self._final: FinishChunk | ErrorChunk | None = None
        self._ended_at: float | None = None

    def observe(self, chunk: Chunk) -> None:
        now = self._clock()
        match chunk:
            case PrefillProgressChunk(prompt_tokens=total, done_tokens=done):
                self._progress = chunk
                self._prefill_started_at = self._prefill_started_at or now
                if done >= total and self._prefill_ended_at is None:
                    self._prefill_ended_at = now
            case FinishChunk() | ErrorChunk():
                self._final = chunk
                self._ended_at = now
            case _:
                self._first_output_at = self._first_output_at or now

    async def tap(self, chunks: AsyncIterator[Chunk]) -> AsyncIterator[Chunk]:
        """`chunks`, observed on their way through."""
        async for chunk in chunks:
            self.observe(chunk)
            yield chunk

    def where(self) -> str:
        """Where the request stands, for a keep-alive comment: queued, prefill done/total, or decode."""
        if self._first_output_at is not None:
            return "decode"
        progress = self._progress
        if progress is None:
            return "queued"
        return f"prefill {progress.done_tokens}/{progress.prompt_tokens} tokens ({progress.cached_tokens} cached)"

    def line(self, *, cancelled: bool) -> str:
        """The request's log line; `cancelled`: the client left before the end."""
        progress = self._progress
        usage = self._final.usage if isinstance(self._final, FinishChunk) else None
        prompt = usage.prompt_tokens if usage else progress.prompt_tokens if progress else None
        cached = usage.cached_tokens if usage else progress.cached_tokens if progress else None
        disk = progress.disk_cached_tokens if progress else None
        prefill_end = self._prefill_ended_at or self._first_output_at
        parts = [
            f"request {self._dialect}",
            f"model={self._model_id}",
            f"node={self._node_id}",
            f"prompt={_count(prompt)}",
            f"cached={_count(cached)} (disk {_count(disk)})",
            f"queue={_span(self._received_at, self._prefill_started_at)}",
            f"prefill={_span(self._prefill_started_at, prefill_end)}",
            f"ttft={_span(self._received_at, self._first_output_at)}",
            f"output={_count(usage.completion_tokens if usage else None)}",
            f"decode={self._decode_speed()}",
            f"finish={self._ending(cancelled)}",
        ]
        return " ".join(parts)

    def log(self, *, cancelled: bool) -> None:
        logger.info("%s", self.line(cancelled=cancelled))

    def _decode_speed(self) -> str:
        final = self._final
        if not isinstance(final, FinishChunk) or self._first_output_at is None or self._ended_at is None:
            return "-"
        seconds = self._ended_at - self._first_output_at
        # The first token ends the prefill; the speed is of the tokens after it.
        tokens = final.usage.completion_tokens - 1
        return f"{tokens / seconds:.1f} tok/s" if seconds > 0 and tokens > 0 else "-"

    def _ending(self, cancelled: bool) -> str:
        match self._final:
            case FinishChunk(finish_reason=reason):
                return reason
            case ErrorChunk(error=error):
                return f"error:{error}"
            case None:
                return "cancelled" if cancelled else "ended without a result"


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _span(start: float | None, end: float | None) -> str:
    return "-" if start is None or end is None else f"{end - start:.2f}s"
