"""Prefilling several prompts together: one batched forward pass feeds the next piece of each, so requests that
arrive at the same time reach their first token at the same time instead of waiting for each other one by one.

The members' KV caches are merged into mlx-lm's batch caches (left-padded to a common length, as its
`BatchGenerator` merges them), each member's piece is right-padded to the longest, and after the pass the padding is
rolled to the left and each member's cache is extracted again. Merging copies: a member's own cache is untouched
until the piece is done, so a piece abandoned between layers, or a member cancelled during it, leaves every cache
as it was before the piece.

Like a single prompt's piece (`prefill.py`), the pass runs a time slice of layers per step, and the pacer sizes it:
the pieces together hold about the tokens one prompt's piece would (a pass costs about its total tokens).
"""

import time
from collections.abc import Sequence

import mlx.core as mx
from mlx import nn
from mlx_lm.generate import _merge_caches as merge_caches  # pyright: ignore[reportPrivateUsage] -- mlx-lm's merge
from mlx_lm.generate import generation_stream

from exo.shared.types.common import TaskId
from exo.worker.engines.mlx.cache.layer_cache import PromptCache, held_token_count
from exo.worker.engines.mlx.discarded_logits import logits_discarded
from exo.worker.engines.mlx.generator.layer_steps import SteppedPass
from exo.worker.engines.mlx.generator.prefill import PiecePacer, PromptPrefill

PAD_TOKEN = 0
"""What fills a shorter piece up to the longest: its positions are rolled into the masked left padding."""
MAX_CONTEXT_PADDING = 256
"""The most the members' caches may differ in length: a shorter one is left-padded to the longest for the pass, and
every member's piece attends over the padded length, so a cold prompt grouped with one that has thousands of cached
tokens would pay for all of them."""


def groupable(candidates: Sequence[tuple[TaskId, PromptPrefill]]) -> list[tuple[TaskId, PromptPrefill]]:
    """The first candidate and those whose caches hold about as many tokens as its own (none if that is unknown)."""
    if not candidates:
        return []
    lengths = [held_token_count(prefill.cache) for _, prefill in candidates]
    anchor = lengths[0]
    if anchor is None:
        return []
    return [
        candidate
        for candidate, length in zip(candidates, lengths, strict=True)
        if length is not None and abs(length - anchor) <= MAX_CONTEXT_PADDING
    ]


class GroupPiece:
    """One piece of each member's prompt (`PromptPrefill`s ready to start one) fed in one batched pass."""

    def __init__(self, model: nn.Module, members: Sequence[tuple[TaskId, PromptPrefill]], pacer: PiecePacer) -> None:
        if len(members) < 2:
            raise ValueError("a group piece needs at least two members")
        self._model = model
        self._pacer = pacer
        share = max(1, pacer.size // len(members))
        self._members = dict(members)
        self._pieces = {
            task_id: prefill.pending[: min(share, len(prefill.pending) - 1)] for task_id, prefill in members
        }
        if not all(self._pieces.values()):
            raise ValueError("every member of a group piece needs more than its last token left to feed")
        self._order = [task_id for task_id, _ in members]
        self._given = [prefill.cache for _, prefill in members]
        self._caches: list[PromptCache] = []
        self._pass = SteppedPass(self._forward)
        self._started = time.monotonic()

    @property
    def members(self) -> list[TaskId]:
        """The members still in the piece (a dropped one is not)."""
        return list(self._members)

    @property
    def padded_tokens(self) -> int:
        """Tokens the pass computes: every member's piece padded to the longest."""
        return len(self._order) * max(len(piece) for piece in self._pieces.values())

    def step(self) -> dict[TaskId, int] | None:
        """Run the pass for about the pacer's step time; once it is done, each remaining member's prefill holds its
        piece and the tokens each was fed are returned (None while the pass still runs)."""
        running = self._pass
        if not running.advance(self._pacer.step_seconds):
            return None
        mx.clear_cache()
        self._pacer.record(self.padded_tokens, running.busy_seconds, running.layers_entered)
        fed: dict[TaskId, int] = {}
        for index, task_id in enumerate(self._order):
            prefill = self._members.get(task_id)
            if prefill is None:
                continue  # dropped while the pass ran: its own cache was never written
            piece = self._pieces[task_id]
            prefill.piece_fed(piece, self._caches[index], started=self._started)
            fed[task_id] = len(piece)
        return fed

    def drop(self, task_id: TaskId) -> None:
        """Leave the piece (the member was cancelled): its result is not handed back; its own cache is untouched."""
        self._members.pop(task_id, None)

    def abandon(self) -> None:
        """Stop between layers; every member's own cache still holds what it held before the piece."""
        self._pass.abandon()

    def _forward(self) -> None:
        pieces = [self._pieces[task_id] for task_id in self._order]
        lengths = [len(piece) for piece in pieces]
        longest = max(lengths)
        padding = [longest - length for length in lengths]
        with mx.stream(generation_stream), logits_discarded():
            batch_cache: list[object] = merge_caches(self._given)  # pyright: ignore[reportUnknownVariableType]
            if max(padding) > 0:
                for layer in batch_cache:
                    layer.prepare(lengths=lengths, right_padding=padding)  # pyright: ignore[reportAttributeAccessIssue,reportUnknownMemberType]
            tokens = mx.array([piece + [PAD_TOKEN] * (longest - len(piece)) for piece in pieces])
            self._model(tokens, cache=batch_cache)
            if max(padding) > 0:
                for layer in batch_cache:
                    layer.finalize()  # pyright: ignore[reportAttributeAccessIssue,reportUnknownMemberType]
            self._caches = [_extract(batch_cache, index) for index in range(len(pieces))]
            mx.eval([getattr(layer, "state", None) for cache in self._caches for layer in cache])


def _extract(batch_cache: Sequence[object], index: int) -> PromptCache:
    """Member `index`'s cache out of the batch caches, without its padding."""
    return [layer.extract(index) for layer in batch_cache]  # pyright: ignore[reportAttributeAccessIssue,reportUnknownMemberType,reportUnknownVariableType]
