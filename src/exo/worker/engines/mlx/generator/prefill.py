"""Prefilling a prompt in pieces sized by time, so the runner looks at its messages (a cancel, a new request) and
reports progress between pieces.

A fixed token count is the wrong unit: the same 512 tokens take milliseconds on a GPU at the start of a prompt and
many seconds on a CPU 15k tokens into one (attention grows with the context). The pacer measures how long each piece
took and sizes the next one to take about `target_seconds`.
"""

import time
from collections.abc import Sequence

import mlx.core as mx
from mlx import nn
from mlx_lm.generate import generation_stream

from exo.worker.engines.mlx.cache.layer_cache import PromptCache, materialize

PIECE_SECONDS = 0.5
"""Target wall time of one piece: a cancel is seen within about this (the issue asks for one second)."""
MIN_PIECE_TOKENS = 32
"""Every forward pass reads all the weights: on a CPU under load a pass of a few tokens costs nearly what one of 32
does, so smaller pieces turn prefill into decoding speed (figures in docs/OPERATIONS.md, "Prefill in pieces"). Below
this a piece may take longer than the target."""
FIRST_PIECE_TOKENS = MIN_PIECE_TOKENS
"""Before anything was measured."""
MAX_PIECE_TOKENS = 4096
MAX_GROWTH = 1.5
"""A piece is at most this many times the last one: the speed measured on a short piece overstates a longer one
(each token attends to more context)."""


class PiecePacer:
    """How many tokens the next prefill piece gets, from the measured speed of the last one."""

    def __init__(self, target_seconds: float = PIECE_SECONDS) -> None:
        if target_seconds <= 0:
            raise ValueError("a piece needs a positive target time")
        self._target = target_seconds
        self._size = FIRST_PIECE_TOKENS

    @property
    def size(self) -> int:
        return self._size

    def record(self, tokens: int, seconds: float) -> None:
        """A piece of `tokens` took `seconds`: size the next one to take the target time."""
        if tokens <= 0:
            return
        fitting = tokens * self._target / max(seconds, 1e-6)
        grown = min(fitting, tokens * MAX_GROWTH, MAX_PIECE_TOKENS)
        self._size = max(MIN_PIECE_TOKENS, int(grown))


class PromptPrefill:
    """Feeds `tokens` into `cache` piece by piece, all but the last (the first decode step feeds that one and samples
    after it)."""

    def __init__(self, model: nn.Module, cache: PromptCache, tokens: Sequence[int], pacer: PiecePacer) -> None:
        if not tokens:
            raise ValueError("a prompt needs at least one token to prefill")
        self._model = model
        self.cache = cache
        self._pacer = pacer
        self.fed: list[int] = []
        """Prompt tokens the cache holds now (after what it held when given)."""
        self.pending: list[int] = list(tokens)
        """Prompt tokens not fed yet; the last one stays here for the decoder."""

    @property
    def finished(self) -> bool:
        return len(self.pending) <= 1

    def step(self) -> None:
        """Feed one piece (nothing when finished)."""
        piece = self.pending[: min(self._pacer.size, len(self.pending) - 1)]
        if not piece:
            return
        started = time.perf_counter()
        with mx.stream(generation_stream):
            self._model(mx.array(piece)[None], cache=self.cache)
            materialize(self.cache)
        mx.clear_cache()
        self._pacer.record(len(piece), time.perf_counter() - started)
        self.fed += piece
        self.pending = self.pending[len(piece) :]
