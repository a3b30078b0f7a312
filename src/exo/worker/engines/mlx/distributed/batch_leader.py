"""Rank 0 of a pipeline decoding its requests together, one batch over every rank.

Each request keeps its own semantics in its `ChatRequest` (prompt, prefix cache lease, processors, sampler, stops,
tool-call parser, finish), exactly as on one node; rank 0 alone chooses every token. Each step rank 0 sends every
other rank a `BatchStep`: who left, who joins (the ranks then agree on the cached prefix each joining prompt has on
every rank), who has read its prompt and starts decoding, one prefill piece of the request reading its prompt, and
the decode rows (member, tokens its cache holds, token to feed). Every rank checks the rows and the piece against its
own view and the ranks sum their findings: a member any rank sees otherwise is dropped everywhere and fails here with
an error, never decoded with a cache that does not match. Then every rank runs the piece and one decode step over
all rows; rank 0 samples each row with its request's processors and sampler.

Requests read their prompts one at a time, a piece per step, while the others decode. Prompt-lookup speculation
does not run here: a draft verified in one pass is several tokens for one row, which the rows' one-token steps and
the per-step check do not carry.

An error outside one request's processors leaves the other ranks at an unknown point of the protocol: every member
fails, the pipeline is broken, and the runner must exit after reporting it.
"""

import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection

import mlx.core as mx

from exo.shared.types.chunks import Chunk, ErrorChunk, Usage
from exo.shared.types.common import TaskId
from exo.worker.engines.mlx.cache.layer_cache import PromptCache
from exo.worker.engines.mlx.cache.prefix_cache import PrefixCache
from exo.worker.engines.mlx.distributed.batch_rows import BatchRows, agree_on_divergence
from exo.worker.engines.mlx.distributed.lockstep import agree_on_cached_tokens, prefill
from exo.worker.engines.mlx.distributed.task_channel import (
    BatchStep,
    FollowTask,
    Leave,
    PrefillPiece,
    StepMember,
    send_message,
)
from exo.worker.engines.mlx.generator.chat_completion import ChatRequest
from exo.worker.engines.mlx.generator.sampling import sample_rows
from exo.worker.engines.mlx.generator.scheduler import RequestUpdate
from exo.worker.engines.mlx.loaded_model import LoadedModel

logger = logging.getLogger(__name__)


class RanksDivergedError(RuntimeError):
    """A rank's view of a member differs from rank 0's: the member cannot be decoded correctly."""


@dataclass
class _Prefilling:
    request: ChatRequest
    cache: PromptCache
    tokens: list[int]
    """The prompt tokens after the prefix every rank holds; all but the last are fed here."""
    fed: int = 0


@dataclass
class _Decoding:
    request: ChatRequest
    fed: list[int]
    """Tokens fed after the cached prefix: what the processors are shown before the next token."""
    pending: int
    """The token fed at the next step (the prompt's last, then each sampled one)."""


class PipelineBatchLeader:
    """Rank 0's batch: requests waiting to join, the one reading its prompt, and the decode rows."""

    def __init__(
        self,
        loaded: LoadedModel,
        followers: Mapping[int, Connection],
        *,
        prefill_step_size: int = 512,
        prefix_cache: PrefixCache | None = None,
    ) -> None:
        """`prefix_cache`: the one the requests lease from, told what each prefill piece cost."""
        if loaded.group is None:
            raise ValueError("a pipeline leader needs its ring")
        self._loaded = loaded
        self._prefix_cache = prefix_cache
        self._group = loaded.group
        self._followers = dict(followers)
        self._prefill_step_size = prefill_step_size
        self._joining: deque[ChatRequest] = deque()
        self._prefilling: _Prefilling | None = None
        self._decoding: dict[TaskId, _Decoding] = {}
        self._rows = BatchRows()
        self._leaves: list[Leave] = []
        self.broken: str | None = None
        """Why the pipeline can no longer run tasks (None while it can)."""

    @property
    def active(self) -> int:
        """Requests admitted and not finished, cancelled or failed."""
        return len(self._joining) + (self._prefilling is not None) + len(self._decoding)

    @property
    def busy(self) -> bool:
        """A step has something to do (a request to advance, or a departure to tell the other ranks)."""
        return self.active > 0 or bool(self._leaves)

    def admit(self, request: ChatRequest) -> None:
        """Take a request; it joins the batch once the requests admitted before it have read their prompts."""
        self._joining.append(request)

    def cancel(self, task_id: TaskId) -> Usage | None:
        """Drop a request (no more chunks); returns its usage so far, None if it is not here."""
        if (waiting := next((r for r in self._joining if r.task_id == task_id), None)) is not None:
            self._joining.remove(waiting)
            return waiting.cancel(None)
        if self._prefilling is not None and self._prefilling.request.task_id == task_id:
            usage = self._prefilling.request.cancel(self._prefilling.cache)
            self._prefilling = None
        elif (decoding := self._decoding.pop(task_id, None)) is not None:
            usage = decoding.request.cancel(self._rows.remove(task_id))
        else:
            return None
        self._leaves.append(Leave(task_id=task_id, keep=True))
        return usage

    def step(self) -> list[RequestUpdate]:
        """Run one step over every rank; on a pipeline failure every member fails and `broken` says why."""
        if self.broken is not None:
            raise RuntimeError(f"the pipeline is broken: {self.broken}")
        updates: list[RequestUpdate] = []
        try:
            self._step(updates)
        except Exception as error:
            self.broken = f"{type(error).__name__}: {error}"
            logger.error("pipeline broken: %s", self.broken)
            updates += self._fail_all(error)
        return updates

    # ---- one step -------------------------------------------------------------------------------

    def _step(self, updates: list[RequestUpdate]) -> None:
        entering = self._enter_if_read()
        piece = self._next_piece()
        # The next request joins once none is reading its prompt (the one entering now has read its own).
        joining = self._joining.popleft() if self._prefilling is None and self._joining else None
        message = BatchStep(
            leaves=tuple(self._leaves),
            joins=(FollowTask(task=joining.task, prompt_tokens=tuple(joining.prompt_tokens)),) if joining else (),
            enters=(entering,) if entering is not None else (),
            prefill=piece,
            members=tuple(
                StepMember(task_id=task_id, held=held, token=self._decoding[task_id].pending)
                for task_id, held in zip(self._rows.ids, self._rows.held, strict=True)
            ),
        )
        self._leaves = []
        for connection in self._followers.values():
            send_message(connection, message)
        if joining is not None:
            updates.append(self._join(joining))
        if not message.checks:
            return
        diverged = agree_on_divergence(self._group, [False] * (len(message.members) + 1))
        for member, flagged in zip(message.members, diverged, strict=False):
            if flagged:
                updates.append(self._drop_diverged_row(member.task_id))
        if piece is not None:
            if diverged[-1]:
                updates.append(self._drop_diverged_prefill())
            else:
                updates += self._prefill_piece(piece)
        if self._rows.ids:
            updates += self._decode()

    def _join(self, request: ChatRequest) -> RequestUpdate:
        """Every rank agrees on the prompt prefix all of them hold; the request reads the rest from the next step."""
        request.limit_cached_tokens(agree_on_cached_tokens(self._group, request.cached_tokens))
        self._prefilling = _Prefilling(request, request.take_cache(), request.prefill_tokens)
        return RequestUpdate(
            request.task_id, [request.prefill_progress(request.cached_tokens)], done=False, generated_tokens=0
        )

    def _enter_if_read(self) -> TaskId | None:
        """The request reading its prompt starts decoding once all but its last prompt token are fed."""
        prefilling = self._prefilling
        if prefilling is None or prefilling.fed < len(prefilling.tokens) - 1:
            return None
        self._prefilling = None
        request = prefilling.request
        held = request.cached_tokens + prefilling.fed
        self._rows.add(request.task_id, prefilling.cache, held)
        self._decoding[request.task_id] = _Decoding(request, fed=prefilling.tokens[:-1], pending=prefilling.tokens[-1])
        return request.task_id

    def _next_piece(self) -> PrefillPiece | None:
        prefilling = self._prefilling
        if prefilling is None:
            return None
        length = min(self._prefill_step_size, len(prefilling.tokens) - 1 - prefilling.fed)
        start = prefilling.request.cached_tokens + prefilling.fed
        return PrefillPiece(task_id=prefilling.request.task_id, start=start, length=length)

    def _prefill_piece(self, piece: PrefillPiece) -> list[RequestUpdate]:
        prefilling = self._prefilling
        assert prefilling is not None
        tokens = prefilling.tokens[prefilling.fed : prefilling.fed + piece.length]
        prefill(self._loaded.model, prefilling.cache, tokens, max(len(tokens), 1), prefix_cache=self._prefix_cache)
        prefilling.fed += len(tokens)
        request = prefilling.request
        progress = request.prefill_progress(request.cached_tokens + prefilling.fed)
        return [RequestUpdate(request.task_id, [progress], done=False, generated_tokens=0)]

    def _decode(self) -> list[RequestUpdate]:
        """One decode step over every row: each row's token, chosen by its own request."""
        logits = self._rows.forward(
            self._loaded.model, [self._decoding[t].pending for t in self._rows.ids], leader=True
        )
        assert logits is not None
        samples: list[mx.array] = []
        for row, task_id in enumerate(self._rows.ids):
            member = self._decoding[task_id]
            member.fed.append(member.pending)
            request = member.request
            row_logits = logits[row : row + 1]
            if not request.processors.empty:
                row_logits = request.processors(mx.array(member.fed), row_logits)
            samples.append(sample_rows(request.sampler, row_logits).reshape(1))  # a greedy row is not normalized
        tokens: list[int] = mx.concatenate(samples).tolist()  # pyright: ignore[reportAssignmentType] -- 1-D ids
        updates: list[RequestUpdate] = []
        for task_id, token in zip(list(self._rows.ids), tokens, strict=True):
            member = self._decoding[task_id]
            request = member.request
            chunks = request.accept([token])
            failure = request.processors.error
            if failure is None and not request.finished:
                member.pending = token
                updates.append(RequestUpdate(task_id, chunks, done=False, generated_tokens=len(request.generated)))
                continue
            del self._decoding[task_id]
            cache = self._rows.remove(task_id)
            self._leaves.append(Leave(task_id=task_id, keep=failure is None))
            ending: list[Chunk] = [request.fail(failure)] if failure is not None else request.finish(cache)
            updates.append(RequestUpdate(task_id, chunks + ending, done=True, generated_tokens=len(request.generated)))
        return updates

    # ---- failures -------------------------------------------------------------------------------

    def _drop_diverged_row(self, task_id: TaskId) -> RequestUpdate:
        """Every rank drops the row; the request fails (its cache on some rank is not what rank 0 thinks)."""
        request = self._decoding.pop(task_id).request
        self._rows.remove(task_id)
        return self._diverged(request)

    def _drop_diverged_prefill(self) -> RequestUpdate:
        assert self._prefilling is not None
        request, self._prefilling = self._prefilling.request, None
        return self._diverged(request)

    @staticmethod
    def _diverged(request: ChatRequest) -> RequestUpdate:
        error = RanksDivergedError("the pipeline's ranks disagree on this request's state; it was stopped")
        logger.error("task %s: %s", request.task_id, error)
        return RequestUpdate(request.task_id, [request.fail(error)], done=True, generated_tokens=len(request.generated))

    def _fail_all(self, error: Exception) -> list[RequestUpdate]:
        requests = [*self._joining, *(member.request for member in self._decoding.values())]
        if self._prefilling is not None:
            requests.append(self._prefilling.request)
        self._joining.clear()
        self._decoding.clear()
        self._prefilling = None
        self._rows = BatchRows()
        updates: list[RequestUpdate] = []
        for request in requests:
            request.fail(error)
            crashed = ErrorChunk(
                error="runner_crashed",
                message=f"a rank of this split model stopped answering ({self.broken}); its ranks are being restarted",
            )
            updates.append(
                RequestUpdate(request.task_id, [crashed], done=True, generated_tokens=len(request.generated))
            )
        return updates
