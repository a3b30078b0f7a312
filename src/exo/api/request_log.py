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

from exo.shared.types.chunks import Chunk, ErrorChunk, FinishChunk, PrefillProgressChunk
from exo.shared.types.common import ModelId, NodeId
from exo.shared.types.request_record import ERROR_MESSAGE_CHARS, Dialect, RequestOutcome, RequestRecord

logger = logging.getLogger(__name__)


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
        self._dialect: Dialect = dialect
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

    def record(self, *, cancelled: bool) -> RequestRecord:
        """What /state keeps about the request once it ended; `cancelled`: the client left before the end."""
        progress = self._progress
        final = self._final
        usage = final.usage if isinstance(final, FinishChunk) else None
        prefill_end = self._prefill_ended_at or self._first_output_at
        outcome = _outcome(final, cancelled)
        return RequestRecord(
            dialect=self._dialect,
            model_id=self._model_id,
            served_by=self._node_id,
            outcome=outcome,
            finish_reason=final.finish_reason if isinstance(final, FinishChunk) else None,
            error_kind=final.error if isinstance(final, ErrorChunk) else None,
            error=_error_message(final, cancelled),
            prompt_tokens=usage.prompt_tokens if usage else progress.prompt_tokens if progress else None,
            cached_tokens=usage.cached_tokens if usage else progress.cached_tokens if progress else None,
            disk_cached_tokens=progress.disk_cached_tokens if progress else None,
            completion_tokens=usage.completion_tokens if usage else None,
            queue_seconds=_span(self._received_at, self._prefill_started_at),
            prefill_seconds=_span(self._prefill_started_at, prefill_end),
            time_to_first_token_seconds=_span(self._received_at, self._first_output_at),
            decode_tokens_per_second=self._decode_speed(),
            ended_at=time.time(),
        )

    def line(self, *, cancelled: bool) -> str:
        """The request's log line; `cancelled`: the client left before the end."""
        return _line(self.record(cancelled=cancelled))

    def log(self, *, cancelled: bool) -> None:
        logger.info("%s", self.line(cancelled=cancelled))

    def _decode_speed(self) -> float | None:
        final = self._final
        if not isinstance(final, FinishChunk) or self._first_output_at is None or self._ended_at is None:
            return None
        seconds = self._ended_at - self._first_output_at
        # The first token ends the prefill; the speed is of the tokens after it.
        tokens = final.usage.completion_tokens - 1
        return tokens / seconds if seconds > 0 and tokens > 0 else None


def _outcome(final: FinishChunk | ErrorChunk | None, cancelled: bool) -> RequestOutcome:
    """How the request ended for its client: an answer the model finished counts only once the client had it all
    (one that left first, or whose connection broke, did not get it: cancelled); an error is a failure whenever."""
    match final:
        case ErrorChunk():
            return "failed"
        case _ if cancelled:
            return "cancelled"
        case FinishChunk():
            return "finished"
        case None:
            return "failed"


def _error_message(final: FinishChunk | ErrorChunk | None, cancelled: bool) -> str | None:
    match final:
        case ErrorChunk(message=message):
            return message[:ERROR_MESSAGE_CHARS]
        case None if not cancelled:
            return "ended without a result"
        case _:
            return None


def _line(record: RequestRecord) -> str:
    decode = record.decode_tokens_per_second
    parts = [
        f"request {record.dialect}",
        f"model={record.model_id}",
        f"node={record.served_by}",
        f"prompt={_count(record.prompt_tokens)}",
        f"cached={_count(record.cached_tokens)} (disk {_count(record.disk_cached_tokens)})",
        f"queue={_seconds(record.queue_seconds)}",
        f"prefill={_seconds(record.prefill_seconds)}",
        f"ttft={_seconds(record.time_to_first_token_seconds)}",
        f"output={_count(record.completion_tokens)}",
        f"decode={'-' if decode is None else f'{decode:.1f} tok/s'}",
        f"finish={_ending(record)}",
    ]
    return " ".join(parts)


def _ending(record: RequestRecord) -> str:
    match record.outcome:
        case "finished":
            return str(record.finish_reason)
        case "failed":
            return f"error:{record.error_kind}" if record.error_kind else str(record.error)
        case "cancelled":
            return "cancelled"


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _span(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else end - start


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"
