"""Which decoder runs the active requests of one model, between tokens.

A request first prefills the part of its prompt the prefix cache does not hold, a time slice of a piece's layers per
step (`prefill.py`), while the others keep decoding; a cancel between steps stops it and what the finished pieces
computed still fills the prefix cache. Requests waiting to prefill together are fed together, a piece of each in one
batched pass (`group_prefill.py`), so simultaneous arrivals reach their first token together rather than one after
another. Then it decodes.

One request alone decodes on the `SoloDecoder`, where it can use prompt-lookup speculation (drafts verified in one
forward pass). Two or more share one mlx-lm batch: a request arriving while another decodes alone moves that one
into the batch with its KV cache (no token is recomputed), and when a batch is down to one speculative (greedy)
member that member moves back out to decode alone (its last token is fed again: one extra token of work).

Each request's semantics stay in its `ChatRequest`; this module only moves token ids and caches around. A failure
in one member's grammar fails that member alone; a failure of the forward pass fails the members that were in it.
"""

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mlx import nn

from exo.shared.types.chunks import Chunk, Usage
from exo.shared.types.common import TaskId
from exo.shared.types.worker.decode_settings import DecodeSettings, LookupSettings
from exo.worker.engines.mlx.cache.layer_cache import PromptCache, trim_tokens
from exo.worker.engines.mlx.generator.batch import BatchDecoder, BatchMember
from exo.worker.engines.mlx.generator.beside import (
    Accepted,
    AfterLaunch,
    BesideWorker,
    beside_worker,
    launch_computes_on_host,
)
from exo.worker.engines.mlx.generator.chat_completion import ChatRequest
from exo.worker.engines.mlx.generator.draft_policy import DraftPolicy, StepCosts
from exo.worker.engines.mlx.generator.group_prefill import GroupPiece, groupable
from exo.worker.engines.mlx.generator.prefill import PiecePacer, PromptPrefill
from exo.worker.engines.mlx.generator.solo import SoloDecoder, SpeculationStats
from exo.worker.engines.mlx.step_clock import STEP_CLOCK

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RequestUpdate:
    """What one step produced for one request."""

    task_id: TaskId
    chunks: list[Chunk]
    done: bool
    """The last chunk is the request's Finish or Error chunk; it has left the scheduler."""
    generated_tokens: int


@dataclass
class PrefillStats:
    """Prefill pieces fed so far: how many, and how many prompts the batched ones fed together."""

    pieces: int = 0
    grouped_pieces: int = 0
    """Pieces that fed two or more prompts in one pass."""
    largest_group: int = 0
    by_prompts: dict[int, int] = field(default_factory=dict[int, int])
    """Pieces by how many prompts each fed (1: alone)."""

    def count(self, prompts: int) -> None:
        """One piece fed `prompts` prompts."""
        self.pieces += 1
        self.by_prompts[prompts] = self.by_prompts.get(prompts, 0) + 1
        if prompts > 1:
            self.grouped_pieces += 1
            self.largest_group = max(self.largest_group, prompts)


@dataclass(frozen=True)
class _AcceptedAhead:
    """A step's tokens handed to the helper thread before the next step was launched (`beside.py`), and their chunks
    per request once accepted there."""

    tokens: list[tuple[TaskId, int]]
    chunks: Accepted[dict[TaskId, list[Chunk]]]


@dataclass(frozen=True)
class _Prefilled:
    """A request whose prompt is in its cache, about to decode."""

    request: ChatRequest
    cache: PromptCache
    fed: list[int]
    pending: list[int]


class GenerationScheduler:
    """The active requests of one loaded model and the decoder each one is on."""

    def __init__(
        self,
        model: nn.Module,
        settings: DecodeSettings,
        *,
        on_prefill_piece: Callable[[int, float], None] | None = None,
    ) -> None:
        """`on_prefill_piece` is told each prefill piece's tokens and working seconds."""
        self._model = model
        self._settings = settings
        self._pacer = PiecePacer(
            settings.prefill_piece_seconds,
            floor_seconds_per_token=settings.slow_prefill_seconds_per_token,
            on_piece=on_prefill_piece,
        )
        self._prefilling: dict[TaskId, tuple[ChatRequest, PromptPrefill]] = {}
        """In order of arrival; the first one is fed a piece per step, with the others ready for one beside it."""
        self._group: GroupPiece | None = None
        """The batched piece being fed to several prefilling requests."""
        self.prefill_stats = PrefillStats()
        self._waiting: dict[TaskId, _Prefilled] = {}
        self._solo: tuple[ChatRequest, SoloDecoder] | None = None
        self._batch: BatchDecoder | None = None
        self._batched: dict[TaskId, ChatRequest] = {}
        self.speculation = SpeculationStats()
        """Drafts verified and accepted by every solo decoder so far."""
        self.chained_steps = 0
        """Solo steps launched on the lazily sampled token of the step before them (overlap)."""
        self.chained_grammar_steps = 0
        """Of those, steps under a grammar: their forward pass ran while the host fed the grammar its token and computed
        their mask."""
        self.batch_grammar_steps = 0
        """Batch steps with a constrained member whose forward pass was launched before the members' masks: each
        grammar was fed its token and computed its mask while the pass ran (`BatchDecoder.settle`)."""
        self.batch_grammar_joins = 0
        """Joins with a constrained newcomer whose first forward pass was launched before the newcomers' first masks,
        computed while it ran (`JoinPrompts`)."""
        self.step_costs = StepCosts()
        """What solo forward passes cost here, by tokens fed: whether a draft is worth verifying."""
        self._beside: BesideWorker | None = (
            beside_worker() if settings.overlap and settings.accept_beside and launch_computes_on_host() else None
        )
        """Where the launch computes the pass on the host: the helper that accepts a step's tokens meanwhile."""
        self._ahead: _AcceptedAhead | None = None
        """The batch step's tokens being accepted beside its successor's launch (`_accept_ahead`)."""
        self.steps_accepted_beside = 0
        """Steps whose tokens were accepted on the helper thread while the next step was launched."""

    @property
    def active(self) -> int:
        """Requests admitted and not finished, cancelled or failed."""
        return len(self._prefilling) + self._decoding

    @property
    def decoding(self) -> int:
        """Requests past their prefill (decoding, or about to at the next step)."""
        return self._decoding

    @property
    def _decoding(self) -> int:
        return len(self._waiting) + len(self._batched) + (1 if self._solo else 0)

    def admit(self, request: ChatRequest) -> None:
        """Take a request; its prefill starts once the requests admitted before it have prefilled."""
        prefill = PromptPrefill(self._model, request.take_cache(), request.prefill_tokens, self._pacer)
        self._prefilling[request.task_id] = (request, prefill)

    def cancel(self, task_id: TaskId) -> Usage | None:
        """Drop a request (no more chunks); returns its usage so far, None if it is not here."""
        if (prefilling := self._prefilling.pop(task_id, None)) is not None:
            request, prefill = prefilling
            if self._group is not None:
                self._group.drop(task_id)  # its own cache was not written: the piece hands it nothing back
                if not self._group.members:
                    self._group.abandon()
                    self._group = None
            usage = request.cancel(prefill.abandon())
        elif (prefilled := self._waiting.pop(task_id, None)) is not None:
            usage = prefilled.request.cancel(prefilled.cache)
        elif self._solo is not None and self._solo[0].task_id == task_id:
            request, decoder = self._solo
            self._solo = None
            usage = request.cancel(decoder.cache)
        elif (request := self._batched.pop(task_id, None)) is not None:
            assert self._batch is not None
            usage = request.cancel(self._batch.remove(task_id).cache)
        else:
            usage = None
        return usage

    def step(self) -> list[RequestUpdate]:
        """Feed one prefill piece of the first request still prefilling, and advance every decoding request by one
        decode step."""
        updates = self._prefill_step()
        if self._decoding > 1 and self._solo is not None:
            updates += self._end_solo()
        if self._decoding == 0:
            return updates
        if self._decoding == 1:
            self._leave_batch_if_alone()
            if self._solo is None and self._waiting:
                prefilled = self._waiting.popitem()[1]
                self._start_solo(prefilled.request, prefilled.cache, fed=prefilled.fed, pending=prefilled.pending)
            if self._solo is not None:
                return updates + self._solo_step()
            return updates + self._batch_step()
        for prefilled in self._waiting.values():
            self._join_batch(prefilled.request, prefilled.cache, fed=prefilled.fed, pending=prefilled.pending)
        self._waiting.clear()
        return updates + self._batch_step()

    def fail_all(self, error: Exception) -> list[RequestUpdate]:
        """Fail every active request (something outside any one request broke) and start afresh."""
        if self._group is not None:
            self._group.abandon()
            self._group = None
        for _, prefill in self._prefilling.values():
            prefill.abandon()  # ends a piece paused between layers now, not whenever it is collected
        requests = [request for request, _ in self._prefilling.values()]
        requests += [prefilled.request for prefilled in self._waiting.values()]
        requests += self._batched.values()
        if self._solo is not None:
            requests.append(self._solo[0])
        self._prefilling.clear()
        self._waiting.clear()
        self._batched.clear()
        self._solo = None
        self._reset_batch()
        return [self._failed(request, error) for request in requests]

    # ---- prefill --------------------------------------------------------------------------------

    def _prefill_step(self) -> list[RequestUpdate]:
        """One piece of the oldest prefilling request's prompt (with those of the others ready for one, in one pass),
        reported as progress; a request whose prompt is in moves on to decode."""
        if self._group is not None:
            return self._group_step(self._group)
        for task_id, (request, prefill) in list(self._prefilling.items()):
            if prefill.finished:  # its prompt is in (a cached prefix can hold all of it): no need to wait its turn
                del self._prefilling[task_id]
                self._waiting[task_id] = _Prefilled(request, prefill.cache, fed=prefill.fed, pending=prefill.pending)
        if not self._prefilling:
            return []
        task_id, (request, prefill) = next(iter(self._prefilling.items()))
        if not prefill.running and self._settings.batch_size > 1:
            ready = groupable([(other_id, other) for other_id, (_, other) in self._prefilling.items() if other.ready])
            if len(ready) > 1:
                self._group = GroupPiece(self._model, ready[: self._settings.batch_size], self._pacer)
                return self._group_step(self._group)
        try:
            with STEP_CLOCK.part("prefill"):
                fed = prefill.step()
        except Exception as error:
            logger.exception("prefill failed for task %s", task_id)
            del self._prefilling[task_id]
            return [self._failed(request, error)]
        if prefill.finished:
            del self._prefilling[task_id]
            self._waiting[task_id] = _Prefilled(request, prefill.cache, fed=prefill.fed, pending=prefill.pending)
        if not fed:
            return []  # mid-piece, or nothing to prefill (the start was reported at admission)
        self.prefill_stats.count(1)
        return [self._fed(task_id, request, prefill)]

    def _group_step(self, group: GroupPiece) -> list[RequestUpdate]:
        """Advance the batched piece; once it is done, each member's progress, and the prompts now in move on."""
        try:
            with STEP_CLOCK.part("prefill"):
                fed = group.step()
        except Exception as error:
            logger.exception("prefill failed for tasks %s", group.members)
            self._group = None
            failed = [self._prefilling.pop(task_id)[0] for task_id in group.members]
            return [self._failed(request, error) for request in failed]
        if fed is None:
            return []
        self._group = None
        self.prefill_stats.count(len(fed))
        updates: list[RequestUpdate] = []
        for task_id in fed:
            request, prefill = self._prefilling[task_id]
            if prefill.finished:
                del self._prefilling[task_id]
                self._waiting[task_id] = _Prefilled(request, prefill.cache, fed=prefill.fed, pending=prefill.pending)
            updates.append(self._fed(task_id, request, prefill))
        return updates

    @staticmethod
    def _fed(task_id: TaskId, request: ChatRequest, prefill: PromptPrefill) -> RequestUpdate:
        progress = request.prefill_progress(request.cached_tokens + len(prefill.fed))
        return RequestUpdate(task_id, [progress], done=False, generated_tokens=0)

    # ---- alone ----------------------------------------------------------------------------------

    def _start_solo(self, request: ChatRequest, cache: PromptCache, *, fed: list[int], pending: list[int]) -> None:
        speculation = self._settings.speculation if request.speculative else None
        decoder = SoloDecoder(
            self._model,
            cache,
            fed=fed,
            pending=pending,
            sampler=request.sampler,
            processors=request.processors,
            drafts=request.propose_draft if speculation else None,
            policy=self._draft_policy(speculation) if speculation else None,
            costs=self.step_costs,
            fast_forward=self._settings.grammar_fast_forward and speculation is not None,
        )
        self._solo = (request, decoder)

    def _draft_policy(self, speculation: LookupSettings) -> DraftPolicy:
        # Without adaptation the policy sees no measured costs, so it verifies every draft in full.
        costs = self.step_costs if speculation.adaptive else StepCosts()
        return DraftPolicy(costs, speculation.max_draft_tokens)

    def _solo_step(self) -> list[RequestUpdate]:
        assert self._solo is not None
        request, decoder = self._solo
        if not decoder.launched:
            decoder.launch(request.remaining_tokens - 1)
        # Overlap: the next step is launched on the token the step in flight is sampling, before that token is read,
        # so accepting it (detokenizing, parsing, stop checks), sending its chunks and, under a grammar, computing the
        # next mask run while the device computes the next forward pass. Not where the step in flight is the
        # request's last (a length finish), nor where the next step's input needs that work (`SoloDecoder.can_chain`):
        # then the next step is launched after the accept.
        chained = self._settings.overlap and request.remaining_tokens >= 2 and decoder.can_chain()
        ahead: list[tuple[list[int], Accepted[list[Chunk]]]] = []
        if chained:
            beside = self._beside

            def accept_beside(tokens: list[int]) -> AfterLaunch:
                # The launch computes the pass on the host: the step in flight's token is accepted meanwhile.
                assert beside is not None
                accepted = beside.submit(lambda: request.accept(tokens))
                ahead.append((tokens, accepted))
                self.steps_accepted_beside += 1
                return accepted.wait

            try:
                decoder.chain(accept_beside if beside is not None else None)
            except Exception as error:  # the step in flight failed (read ahead), or building the next one did
                for _, accepted in ahead:
                    accepted.wait()  # the helper is done with the request before it is failed
                logger.exception("decoding task %s failed", request.task_id)
                self._solo = None
                return [self._failed(request, error)]
            self.chained_steps += 1
            if request.processors.constrained:
                self.chained_grammar_steps += 1
        update = self._collect_solo(ahead[0] if ahead else None)
        if update.done or not self._decodes_alone(decoder):
            return [update]  # a chained step was discarded with the ending or the going back
        if chained:
            decoder.settle_chained(request.remaining_tokens - 1)  # its mask, now that its input token is accepted
        else:
            # Launch the next step now: it computes while this step's chunks are sent.
            decoder.launch(request.remaining_tokens - 1)
        return [update]

    def _collect_solo(self, ahead: tuple[list[int], Accepted[list[Chunk]]] | None = None) -> RequestUpdate:
        """The launched solo step's tokens, handed to its request (or, `ahead`, the chunks the helper made of them);
        the solo slot is emptied if the request ended."""
        assert self._solo is not None
        request, decoder = self._solo
        before = (decoder.stats.steps, decoder.stats.drafted, decoder.stats.accepted)
        try:
            tokens = decoder.collect()
        except Exception as error:
            logger.exception("decoding task %s failed", request.task_id)
            if ahead is not None:
                ahead[1].wait()
            self._solo = None
            return self._failed(request, error)
        self.speculation.steps += decoder.stats.steps - before[0]
        self.speculation.drafted += decoder.stats.drafted - before[1]
        self.speculation.accepted += decoder.stats.accepted - before[2]
        if ahead is None:
            with STEP_CLOCK.part("parse"):
                chunks = request.accept(tokens)
        else:
            read, accepted = ahead
            chunks = accepted.result()
            if read != tokens:
                raise RuntimeError(f"task {request.task_id}: tokens read ahead {read} but collected {tokens}")
        if request.processors.error is not None or request.finished:
            self._solo = None
            decoder.discard_chained()
            return self._ended(request, chunks, decoder.cache)
        if (kept := request.take_rewind()) is not None:
            self._solo = None
            decoder.discard_chained()
            self._rewind(request, decoder.cache, [*decoder.fed, *decoder.pending], kept, cached=len(decoder.fed))
        return RequestUpdate(request.task_id, chunks, done=False, generated_tokens=len(request.generated))

    def _decodes_alone(self, decoder: SoloDecoder) -> bool:
        """Whether `decoder` still runs the solo request (a repair's rewind takes the request off it)."""
        return self._solo is not None and self._solo[1] is decoder

    def _end_solo(self) -> list[RequestUpdate]:
        """Move the request decoding alone into the batch (others arrived), after the step it has in flight."""
        assert self._solo is not None
        request, decoder = self._solo
        updates = [self._collect_solo()] if decoder.launched else []
        if not any(update.done for update in updates) and self._decodes_alone(decoder):
            self._solo = None
            self._join_batch(request, decoder.cache, fed=decoder.fed, pending=decoder.pending)
        return updates

    # ---- together -------------------------------------------------------------------------------

    def _join_batch(self, request: ChatRequest, cache: PromptCache, *, fed: list[int], pending: list[int]) -> None:
        if self._batch is None:
            self._batch = BatchDecoder(
                self._model,
                batch_size=self._settings.batch_size,
                prefill_step_size=self._settings.prefill_step_size,
                overlap=self._settings.overlap,
                read_ahead=self._accept_ahead if self._beside is not None else None,
            )
        member = BatchMember(
            task_id=request.task_id,
            sampler=request.sampler,
            processors=request.processors,
            max_tokens=request.remaining_tokens,
        )
        self._batch.add(member, cache, fed=fed, pending=pending)
        self._batched[request.task_id] = request

    def _leave_batch_if_alone(self) -> None:
        """A lone greedy batch member that is past its prompt moves out to decode alone (and speculate)."""
        if len(self._batched) != 1 or self._batch is None or self._settings.speculation is None:
            return
        task_id, request = next(iter(self._batched.items()))
        if not request.speculative or not self._batch.decoding(task_id):
            return
        del self._batched[task_id]
        removed = self._batch.remove(task_id)
        # The batch already fed the member's last token (and sampled past it): drop that token from the cache so
        # the solo decoder feeds it again and samples the next token itself.
        trim_tokens(removed.cache, 1)
        self._start_solo(request, removed.cache, fed=removed.fed[:-1], pending=removed.fed[-1:])

    def _accept_ahead(self, tokens: list[tuple[TaskId, int]]) -> AfterLaunch:
        """The batch's step is about to launch its successor, whose launch computes on the host: its members' tokens
        are accepted on the helper meanwhile, and `_accept_batch` takes the chunks."""
        assert self._beside is not None
        members = [
            (task_id, self._batched[task_id], new_tokens)
            for task_id, new_tokens in _by_task(tokens).items()
            if task_id in self._batched
        ]
        accepted = self._beside.submit(lambda: {task_id: request.accept(new) for task_id, request, new in members})
        self._ahead = _AcceptedAhead(tokens=tokens, chunks=accepted)
        self.steps_accepted_beside += 1
        return accepted.wait

    def _batch_step(self) -> list[RequestUpdate]:
        assert self._batch is not None
        joins = self._batch.constrained_joins
        try:
            tokens = self._batch.step()
        except Exception as error:
            logger.exception("batch step failed for tasks %s", sorted(self._batched))
            if (ahead := self._take_ahead()) is not None:
                ahead.chunks.wait()  # the helper is done with the members before they are failed
            return self.fail_all(error)
        self.batch_grammar_joins += self._batch.constrained_joins - joins
        updates = self._accept_batch(tokens, decoding=True, ahead=self._take_ahead())
        # The members that ended or went back are out: the others' grammars are fed their tokens now, and compute
        # their masks while the step's forward pass runs (where it was launched before them).
        settled = self._batch.settle()
        # The first tokens of the members that joined in this step: reading them waits for the passes, so only now.
        updates += self._accept_batch(self._batch.take_joined(), decoding=False)
        if settled:
            self.batch_grammar_steps += 1
            for task_id, request in list(self._batched.items()):
                if request.processors.error is not None:  # its grammar refused the token just accepted
                    del self._batched[task_id]
                    updates.append(self._ended(request, [], self._batch.remove(task_id).cache))
        return updates

    def _take_ahead(self) -> _AcceptedAhead | None:
        ahead, self._ahead = self._ahead, None
        return ahead

    def _accept_batch(
        self, tokens: list[tuple[TaskId, int]], *, decoding: bool, ahead: _AcceptedAhead | None = None
    ) -> list[RequestUpdate]:
        """Hand batch members their new tokens (or, `ahead`, take the chunks the helper made of them), and with
        `decoding` every member past its first token a check of its processors (a member that just joined waits for
        its first token: its first mask may have failed); those that ended or went back leave the batch."""
        assert self._batch is not None
        produced = _by_task(tokens)
        accepted: dict[TaskId, list[Chunk]] = {}
        if ahead is not None:
            accepted = ahead.chunks.result()
            if ahead.tokens != tokens:
                raise RuntimeError(f"batch tokens read ahead {ahead.tokens} but stepped {tokens}")
        updates: list[RequestUpdate] = []
        for task_id, request in list(self._batched.items()):
            if task_id not in produced and not (decoding and self._batch.decoding(task_id)):
                continue
            new_tokens = produced.get(task_id, [])
            if task_id in accepted:
                chunks = accepted[task_id]
            else:
                with STEP_CLOCK.part("parse"):
                    chunks = request.accept(new_tokens)
            if request.processors.error is not None or request.finished:
                del self._batched[task_id]
                updates.append(self._ended(request, chunks, self._batch.remove(task_id).cache))
                continue
            if (kept := request.take_rewind()) is not None:
                del self._batched[task_id]
                removed = self._batch.remove(task_id)
                self._rewind(request, removed.cache, removed.fed, kept, cached=len(removed.fed))
            if chunks or new_tokens:
                updates.append(
                    RequestUpdate(request.task_id, chunks, done=False, generated_tokens=len(request.generated))
                )
        return updates

    def _rewind(self, request: ChatRequest, cache: PromptCache, sequence: list[int], kept: int, *, cached: int) -> None:
        """A repair takes the request back to its first `kept` generated tokens: `sequence` is what it fed or will
        feed after the cached prefix (its prompt's uncached rest, then its tokens), of which the cache holds the
        first `cached`. The cache is cut back and the request waits to decode again, on its new processors."""
        sequence = sequence[: len(request.prefill_tokens) + kept]
        trim_tokens(cache, cached - (len(sequence) - 1))
        self._waiting[request.task_id] = _Prefilled(request, cache, fed=sequence[:-1], pending=sequence[-1:])

    def _reset_batch(self) -> None:
        if self._batch is not None:
            self._batch.close()
        self._batch = None

    # ---- endings --------------------------------------------------------------------------------

    def _ended(self, request: ChatRequest, chunks: list[Chunk], cache: PromptCache) -> RequestUpdate:
        """A request left its decoder: finished normally, or failed in its own processors."""
        if request.processors.error is not None:
            return self._failed(request, request.processors.error)
        chunks = chunks + request.finish(cache)
        return RequestUpdate(request.task_id, chunks, done=True, generated_tokens=len(request.generated))

    @staticmethod
    def _failed(request: ChatRequest, error: Exception) -> RequestUpdate:
        return RequestUpdate(request.task_id, [request.fail(error)], done=True, generated_tokens=len(request.generated))


def _by_task(tokens: Sequence[tuple[TaskId, int]]) -> dict[TaskId, list[int]]:
    """A step's tokens grouped by request, in order."""
    produced: dict[TaskId, list[int]] = {}
    for task_id, token in tokens:
        produced.setdefault(task_id, []).append(token)
    return produced
