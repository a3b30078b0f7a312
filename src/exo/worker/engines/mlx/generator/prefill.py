"""Prefilling a prompt in large pieces that pause between decoder layers, so the runner looks at its messages (a
cancel, a new request), lets the other requests decode and reports progress every fraction of a second.

Two sizes matter. A piece (the tokens of one forward pass) should be large: every pass reads all the weights, and on
a CPU a pass over few tokens costs several times more per token than one over hundreds (docs/OPERATIONS.md,
"Prefill in pieces"). A step (what the runner waits for before it reads its messages again) should be short: a
cancel must land within a second. A piece therefore runs as a `SteppedPass`, a time slice of layers per step, and
its size is bounded by time per layer, not per piece: one layer of the next piece should take about
`target_seconds` at most, since a step can only stop between layers.

The sizes are measured, not fixed: the same 512 tokens take milliseconds on a GPU at the start of a prompt and
seconds per layer on a CPU deep into a long one (attention grows with the context).
"""

import time
from collections.abc import Callable, Mapping, Sequence

import mlx.core as mx
from mlx import nn
from mlx_lm.generate import generation_stream

from exo.shared.types.worker.decode_settings import PIECE_SECONDS
from exo.worker.engines.mlx.cache.layer_cache import PromptCache, can_trim, materialize
from exo.worker.engines.mlx.discarded_logits import logits_discarded
from exo.worker.engines.mlx.generator.layer_steps import SteppedPass, install_layer_steps

MIN_PIECE_TOKENS = 32
"""Below this a pass costs nearly what a 32-token one does: prefill would run at decoding speed."""
FIRST_PIECE_TOKENS = 128
"""Before anything was measured."""
MAX_PIECE_TOKENS = 512
"""The fastest piece measured on a CPU (docs/OPERATIONS.md); mlx-lm's own prefill uses pieces of 2,048."""
MAX_GROWTH = 2.0
"""A piece is at most this many times the last one: the speed measured on a short piece overstates a longer one
(each token attends to more context)."""
SLOW_PREFILL_VARIABLE = "EXO_DEBUG_PREFILL_SECONDS_PER_TOKEN"
"""A debugging setting read by the runner: every prompt token takes at least this long to prefill (0, the default:
no delay), so that tests of slow prefills (keep-alives, client timeouts) see one whatever the machine's speed."""


def slow_prefill_seconds_per_token(environment: Mapping[str, str]) -> float:
    """The floor `SLOW_PREFILL_VARIABLE` sets (0 when unset); a value that is not a number >= 0 is refused."""
    text = environment.get(SLOW_PREFILL_VARIABLE, "").strip()
    if not text:
        return 0.0
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:  # also refuses nan
        raise ValueError(f"{SLOW_PREFILL_VARIABLE} must be a number of seconds >= 0, not {text!r}")
    return seconds


class PiecePacer:
    """How many tokens the next prefill piece gets, from the measured cost per layer of the last one."""

    def __init__(
        self,
        target_seconds: float = PIECE_SECONDS,
        *,
        floor_seconds_per_token: float = 0.0,
        on_piece: Callable[[int, float], None] | None = None,
    ) -> None:
        if target_seconds <= 0:
            raise ValueError("a piece needs a positive target time")
        self.target_seconds = target_seconds
        self._on_piece = on_piece
        """Told each piece's tokens and working seconds (the prefix cache weighs a snapshot's load against them)."""
        self.floor_seconds_per_token = floor_seconds_per_token
        """The least a piece may take per token (`SLOW_PREFILL_VARIABLE`): a piece done sooner is held back, in
        steps no longer than `step_seconds`, before the next one starts or the prompt counts as read."""
        self.step_seconds = target_seconds / 2
        """How long a step runs before it pauses at the next layer boundary."""
        self._size = FIRST_PIECE_TOKENS

    @property
    def size(self) -> int:
        return self._size

    def record(self, tokens: int, seconds: float, layers: int) -> None:
        """A piece of `tokens` took `seconds` (not counting its pauses) over `layers` layers (0: the model could not
        pause between layers, the pass is one unit): size the next one so a layer takes about the target time. A
        piece shorter than the size (a prompt's end: an agent's short turn after its cached prefix) can only shrink
        it: its speed says nothing about a longer piece, and sizing from its length set the next long prompt's
        pieces back to a few dozen tokens, measured 2-6% slower over a 2,652-token prompt than starting at 128."""
        if tokens <= 0:
            return
        if self._on_piece is not None:
            self._on_piece(tokens, seconds)
        per_unit = seconds / max(layers, 1)
        fitting = tokens * self.target_seconds / max(per_unit, 1e-6)
        if tokens < self._size:
            self._size = max(MIN_PIECE_TOKENS, min(self._size, int(fitting)))
            return
        grown = min(fitting, tokens * MAX_GROWTH, MAX_PIECE_TOKENS)
        self._size = max(MIN_PIECE_TOKENS, int(grown))


class PromptPrefill:
    """Feeds `tokens` into `cache` piece by piece, all but the last (the first decode step feeds that one and samples
    after it)."""

    def __init__(self, model: nn.Module, cache: PromptCache, tokens: Sequence[int], pacer: PiecePacer) -> None:
        if not tokens:
            raise ValueError("a prompt needs at least one token to prefill")
        self._model = model
        install_layer_steps(model)
        self.cache = cache
        self._pacer = pacer
        self.fed: list[int] = []
        """Prompt tokens the cache holds now (after what it held when given)."""
        self.pending: list[int] = list(tokens)
        """Prompt tokens not fed yet; the last one stays here for the decoder."""
        self._piece: list[int] = []
        self._pass: SteppedPass | None = None
        self._offsets: list[int | None] = []
        """Each layer's offset before the running piece: what an abandoned piece is rolled back to."""
        self._piece_started = 0.0
        self._held_until = 0.0
        """When the last piece may count as done under the pacer's floor (in the past when there is none)."""

    @property
    def finished(self) -> bool:
        return len(self.pending) <= 1 and time.monotonic() >= self._held_until

    @property
    def running(self) -> bool:
        """A piece of this prompt alone is part way through its layers."""
        return self._pass is not None

    @property
    def ready(self) -> bool:
        """No piece running or held back, and more than the last token left: a group piece may take this prompt."""
        return self._pass is None and len(self.pending) > 1 and time.monotonic() >= self._held_until

    def piece_fed(self, piece: Sequence[int], cache: PromptCache, *, started: float) -> None:
        """A group piece started at `started` (`time.monotonic()`) fed `piece`, the first pending tokens: `cache` now
        holds what this cache held, then `piece`."""
        if list(piece) != self.pending[: len(piece)] or len(piece) >= len(self.pending):
            raise ValueError("a group piece feeds the first pending tokens, never the last one")
        self.cache = cache
        self.fed += piece
        self.pending = self.pending[len(piece) :]
        self._held_until = started + len(piece) * self._pacer.floor_seconds_per_token

    def step(self) -> int:
        """Run the current piece for about the pacer's step time, starting a piece if none runs; returns how many
        tokens this step finished feeding (0 while a piece is still running or held back, or when finished)."""
        if (held := self._held_until - time.monotonic()) > 0:
            time.sleep(min(held, self._pacer.step_seconds))
            return 0
        if self._pass is None:
            self._piece = self.pending[: min(self._pacer.size, len(self.pending) - 1)]
            if not self._piece:
                return 0
            self._offsets = [_offset(layer) for layer in self.cache]
            tokens = mx.array(self._piece)[None]
            self._pass = SteppedPass(lambda: self._forward(tokens))
            self._piece_started = time.monotonic()
        running = self._pass
        if not running.advance(self._pacer.step_seconds):
            return 0
        self._pass = None
        mx.clear_cache()
        fed = len(self._piece)
        self._held_until = self._piece_started + fed * self._pacer.floor_seconds_per_token
        self._pacer.record(fed, running.busy_seconds, running.layers_entered)
        self.fed += self._piece
        self.pending = self.pending[fed:]
        return fed

    def abandon(self) -> PromptCache | None:
        """Stop where the prefill stands: the cache holding what the finished pieces fed, or None when a piece was
        cut between layers and its layers cannot drop what it added (the cache is then of no use)."""
        running, self._pass = self._pass, None
        if running is None or not running.started:
            return self.cache
        running.abandon()
        if not can_trim(self.cache):
            return None
        for layer, before in zip(self.cache, self._offsets, strict=True):
            after = _offset(layer)
            if before is None or after is None:
                return None
            if after > before:
                layer.trim(after - before)
        return self.cache

    def _forward(self, tokens: mx.array) -> None:
        with mx.stream(generation_stream), logits_discarded():
            self._model(tokens, cache=self.cache)
            materialize(self.cache)


def _offset(layer: object) -> int | None:
    offset: object = getattr(layer, "offset", None)
    return offset if isinstance(offset, int) else None
