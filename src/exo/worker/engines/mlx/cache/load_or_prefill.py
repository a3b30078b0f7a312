"""Whether loading a disk snapshot beats prefilling the tokens it would save, by this runner's own measurements.

A load reads, hashes and parses the whole snapshot however few tokens it adds to what memory holds. On a CPU prefill
is slow (10-17 ms a token for the default model on two EPYC cores, against 20-24 µs a token's worth of snapshot to
load: `bench.snapshot_load`), so a load pays for itself after a few tokens; where prefill runs at thousands of tokens
a second, a long snapshot that adds a few dozen tokens to memory's match costs more to load than prefilling them.
The two costs are measured as the runner goes: each prefill piece's seconds per token and each load's seconds per
byte, as running averages. Until both have been measured, a snapshot is loaded when it adds at least
`UNMEASURED_MIN_SAVED_TOKENS` tokens: a fresh runner's first prompt otherwise loaded whichever snapshot shared the
chat template's first few tokens with it (seen: a 180 MB snapshot of an opencode session for 6 tokens).
"""

from dataclasses import dataclass

MEASURED_PIECE_TOKENS = 32
"""Pieces shorter than this are not measured: a pass over a few tokens costs nearly what a 32-token one does, so its
cost per token overstates what the saved tokens would add to a longer piece."""
UNMEASURED_MIN_SAVED_TOKENS = MEASURED_PIECE_TOKENS
"""Before both costs are measured, a snapshot adding fewer tokens than this is not loaded: so few shared tokens are
a chat template's opening or chance, and their prefill costs about one short pass on any device."""
NEWEST_WEIGHT = 0.3
"""The newest measurement's weight in a running average: a few pieces or loads settle it, one outlier does not."""


@dataclass
class _RunningAverage:
    value: float | None = None

    def add(self, sample: float) -> None:
        self.value = sample if self.value is None else self.value + NEWEST_WEIGHT * (sample - self.value)


@dataclass(frozen=True)
class LoadEstimate:
    """What a load and the prefill it replaces are expected to cost."""

    load_seconds: float
    prefill_seconds: float

    @property
    def worth_loading(self) -> bool:
        return self.load_seconds <= self.prefill_seconds


class LoadOrPrefill:
    """The running costs of prefilling a token and loading a byte of snapshot on this runner's device."""

    def __init__(self) -> None:
        self._prefill_seconds_per_token = _RunningAverage()
        self._load_seconds_per_byte = _RunningAverage()

    @property
    def prefill_seconds_per_token(self) -> float | None:
        """The running average over measured prefill pieces (None before the first)."""
        return self._prefill_seconds_per_token.value

    @property
    def load_seconds_per_byte(self) -> float | None:
        """The running average over snapshot loads (None before the first)."""
        return self._load_seconds_per_byte.value

    def prefilled(self, tokens: int, seconds: float) -> None:
        """A prefill pass fed `tokens` (all prompts of a batched pass together) in `seconds` of work."""
        if tokens >= MEASURED_PIECE_TOKENS and seconds > 0:
            self._prefill_seconds_per_token.add(seconds / tokens)

    def loaded(self, nbytes: int, seconds: float) -> None:
        """A snapshot of `nbytes` was read, checked and parsed in `seconds`."""
        if nbytes > 0 and seconds > 0:
            self._load_seconds_per_byte.add(seconds / nbytes)

    def worth_loading(self, saved_tokens: int, nbytes: int) -> tuple[bool, LoadEstimate | None]:
        """Whether to load a snapshot of `nbytes` that adds `saved_tokens` to memory's match, with the estimate it
        was decided on (None before both costs were measured: then by `UNMEASURED_MIN_SAVED_TOKENS`)."""
        estimate = self.estimate(saved_tokens, nbytes)
        if estimate is None:
            return saved_tokens >= UNMEASURED_MIN_SAVED_TOKENS, None
        return estimate.worth_loading, estimate

    def estimate(self, saved_tokens: int, nbytes: int) -> LoadEstimate | None:
        """The expected costs of loading a snapshot of `nbytes` and of prefilling the `saved_tokens` it adds to what
        memory holds; None until both costs were measured here."""
        per_token = self.prefill_seconds_per_token
        per_byte = self.load_seconds_per_byte
        if per_token is None or per_byte is None:
            return None
        return LoadEstimate(load_seconds=nbytes * per_byte, prefill_seconds=saved_tokens * per_token)
