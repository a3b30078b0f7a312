"""How many draft tokens are worth verifying: the length with the most expected tokens per second, as measured.

Verifying k drafts feeds k + 1 tokens in one forward pass. Whether that pays depends on the hardware and its load:
on Apple silicon, or an idle CPU with an optimized BLAS, a pass over a few tokens costs about what a pass over one
does; on a CPU shared with other work, a multi-token pass can cost several single ones. So the decoder times its
own passes by the number of tokens fed, relative to its own one-token passes (`StepCosts`, shared by the runner's
requests: relative, so a request over a long context and one over a short context agree) and each request keeps a
running estimate of how often its drafts hold (`DraftPolicy`), learned from verified drafts and from declined
ones compared with what the model then wrote. Copying comes in runs: a draft right after one that held in full is
mostly in the middle of a copy and holds far more often than one after a miss, so the two are estimated apart. A
draft is verified only when its expected yield (1 + p + p² + … + p^k tokens, for per-token acceptance p) over its
measured pass cost beats a plain step's one token; so speculation stays on where it measures faster and steps aside
where it does not, without a setting to tune.
"""

from typing import Final

_COST_DECAY: Final = 0.8
_ACCEPTANCE_DECAY: Final = 0.7
_PRIOR_ACCEPTANCE: Final = 0.5
"""Before any verification a request assumes half its draft tokens hold."""
_MOST_ACCEPTANCE: Final = 0.95
EXPLORE_AFTER_STEPS: Final = 200
"""Declined drafts after which one is verified anyway, to re-measure what multi-token passes cost now."""


def _moving_average(previous: float | None, value: float, decay: float) -> float:
    return value if previous is None else decay * previous + (1 - decay) * value


class StepCosts:
    """What a solo forward pass costs by the number of tokens it fed, relative to a one-token pass over the same
    context, as an exponential moving average (a one-token pass is 1 by definition, once one was recorded)."""

    def __init__(self) -> None:
        self._relative: dict[int, float] = {}

    def record(self, tokens_fed: int, relative_cost: float) -> None:
        self._relative[tokens_fed] = _moving_average(self._relative.get(tokens_fed), relative_cost, _COST_DECAY)

    def measured(self) -> dict[int, float]:
        """Every measured pass length and its relative cost."""
        return dict(self._relative)

    def relative_cost(self, tokens_fed: int) -> float | None:
        """The relative cost of a pass feeding `tokens_fed` tokens: measured, or else the cost of the nearest shorter
        measured pass (of the shortest measured one when none is shorter). None before any pass was measured.

        An unmeasured length is estimated at a lower bound (a pass never costs less than a shorter one), so the
        policy tries it once and then knows. Interpolating instead hides where the cost jumps: with MKL on x86 a
        3-token pass costs 1.27x a 1-token pass and a 4-token pass 2.10x (the BLAS switches from its matrix-vector
        kernels to a packing GEMM), and a line from 1 to 4 tokens made the cheap 3-token pass look not worth trying.
        """
        measured = self._relative.get(tokens_fed)
        if measured is not None or not self._relative:
            return measured
        shorter = max((fed for fed in self._relative if fed < tokens_fed), default=None)
        return self._relative[shorter] if shorter is not None else self._relative[min(self._relative)]


class PassTimes:
    """One decoder's pass times, shared as costs relative to its own one-token passes: those ran over the same
    context, so the ratio leaves out what the context length adds to every pass."""

    def __init__(self, shared: StepCosts) -> None:
        self._shared = shared
        self._plain_seconds: float | None = None

    def record(self, tokens_fed: int, seconds: float) -> None:
        """A pass fed `tokens_fed` tokens in `seconds` (a longer pass before this decoder's first one-token pass
        has nothing to be measured against and is not shared)."""
        if tokens_fed == 1:
            self._plain_seconds = _moving_average(self._plain_seconds, seconds, _COST_DECAY)
            self._shared.record(1, 1.0)
        elif self._plain_seconds is not None:
            self._shared.record(tokens_fed, seconds / self._plain_seconds)


class DraftPolicy:
    """One request's draft lengths, from the shared step costs and its own recent acceptance."""

    def __init__(self, costs: StepCosts, maximum: int) -> None:
        self._costs = costs
        self._maximum = maximum
        self._acceptance = _PRIOR_ACCEPTANCE
        """Per-token acceptance of drafts made after a miss (or before any draft)."""
        self._acceptance_in_copy = _PRIOR_ACCEPTANCE
        """Per-token acceptance of drafts made right after a draft that held in full."""
        self._in_copy = False
        """The last decided draft held in full."""
        self._declined = 0

    @property
    def maximum(self) -> int:
        """The longest draft this policy verifies."""
        return self._maximum

    @property
    def acceptance(self) -> float:
        """Estimated probability that the next draft token holds, given the ones before it did (and whether the
        last draft held in full)."""
        return min(self._acceptance_in_copy if self._in_copy else self._acceptance, _MOST_ACCEPTANCE)

    def draft_length(self, available: int) -> int:
        """How many of `available` draft tokens to verify (0: a plain step is expected to be faster)."""
        if self._declined >= EXPLORE_AFTER_STEPS:
            return min(available, self._maximum)
        return self._best_length(available, self.acceptance)

    def forced_length(self, available: int) -> int:
        """How many of `available` tokens a grammar forces to verify at once: each one holds unless the model would
        split the same text into other tokens, so only the measured pass costs decide."""
        return self._best_length(available, _MOST_ACCEPTANCE)

    def _best_length(self, available: int, acceptance: float) -> int:
        limit = min(available, self._maximum)
        if limit <= 0:
            return 0
        plain = self._costs.relative_cost(1)
        if plain is None:
            return limit
        best_length, best_rate = 0, 1.0 / plain
        expected, term = 1.0, 1.0
        for length in range(1, limit + 1):
            term *= acceptance
            expected += term
            cost = self._costs.relative_cost(length + 1) or plain
            if expected / cost > best_rate:
                best_length, best_rate = length, expected / cost
        return best_length

    def declined(self) -> None:
        """A draft was available and not verified (a plain step looked faster)."""
        self._declined += 1

    def record(self, drafted: int, accepted: int) -> None:
        """Learn from a verification: `accepted` of `drafted` draft tokens held."""
        self._declined = 0
        self.observe(drafted, accepted)

    def observe(self, drafted: int, accepted: int) -> None:
        """Learn how often drafts hold: `accepted` of `drafted` draft tokens matched what the model wrote (verified,
        or a declined draft compared with the tokens that followed)."""
        # Each verification estimates the per-token rate as held / tried (the first miss ends the tries); a moving
        # average over verifications follows a request into and out of copying quickly.
        tried = accepted + (1 if accepted < drafted else 0)
        rate = accepted / tried
        if self._in_copy:
            self._acceptance_in_copy = _moving_average(self._acceptance_in_copy, rate, _ACCEPTANCE_DECAY)
        else:
            self._acceptance = _moving_average(self._acceptance, rate, _ACCEPTANCE_DECAY)
        self._in_copy = accepted == drafted
