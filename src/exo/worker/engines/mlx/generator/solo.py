"""Decoding one sequence with the model to itself (its prompt already prefilled): one forward pass per step that also
checks prompt-lookup drafts.

A step feeds the pending token plus any draft tokens, samples at every position and keeps the drafts up to the first
one that differs from the model's own choice, plus that choice: one to `len(draft) + 1` tokens per forward pass.
Greedy output is token for token the output without drafts, since every kept token is the argmax given exactly the
tokens before it. The cache and the grammar are rolled back past the rejected drafts.

Like mlx-lm's `generate_step`, the next step is launched (`mx.async_eval`) before the caller handles this step's
tokens, so detokenizing, parsing and sending overlap the next forward pass.
"""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mlx.core as mx
from mlx import nn
from mlx_lm.generate import generation_stream

from exo.worker.engines.mlx.cache.layer_cache import PromptCache, trim_tokens
from exo.worker.engines.mlx.generator.draft_policy import DraftPolicy, PassTimes, StepCosts
from exo.worker.engines.mlx.generator.processors import RequestProcessors
from exo.worker.engines.mlx.generator.sampling import Sampler, sample_rows
from exo.worker.engines.mlx.step_clock import STEP_CLOCK

DraftSource = Callable[[int], list[int]]
"""Given a limit, draft tokens to follow the last generated token (an empty list for none)."""


@dataclass(frozen=True)
class _LaunchedStep:
    inputs: list[int]
    """The pending token, then the draft."""
    samples: mx.array
    """The model's token after each input (one per position), still being computed."""
    started: float
    """`time.perf_counter()` when it was launched."""
    forced: bool = False
    """The draft is what the grammar forces (not a prompt-lookup guess the policy should learn from)."""

    @property
    def draft(self) -> list[int]:
        return self.inputs[1:]


@dataclass
class SpeculationStats:
    steps: int = 0
    drafted: int = 0
    accepted: int = 0


class SoloDecoder:
    """Decodes one sequence: feeds `pending` (one token) on top of `cache`, which holds the prompt but its last token
    (the cached prefix, then `fed`)."""

    def __init__(
        self,
        model: nn.Module,
        cache: PromptCache,
        *,
        fed: Sequence[int],
        pending: Sequence[int],
        sampler: Sampler,
        processors: RequestProcessors,
        drafts: DraftSource | None,
        policy: DraftPolicy | None = None,
        costs: StepCosts | None = None,
        fast_forward: bool = False,
    ) -> None:
        if len(pending) != 1:
            raise ValueError(f"a decoder starts from one token to feed, not {len(pending)} (prefill the rest first)")
        self._model = model
        self.cache = cache
        self.fed: list[int] = list(fed)
        """Tokens the cache holds after the cached prefix, in order: what processors are shown before new ones."""
        self.pending: list[int] = list(pending)
        """The token to feed next: the prompt's last, then the last sampled one."""
        self._sampler = sampler
        self._processors = processors
        self._drafts = drafts
        self._policy = policy
        self._times = PassTimes(costs) if costs is not None else None
        self._fast_forward = fast_forward
        self._launched: _LaunchedStep | None = None
        self._unverified: list[int] = []
        """A draft the policy declined, checked against the tokens the model goes on to write: whether it would have
        held is learned for free, so a request that starts copying is noticed without verifying anything."""
        self._unverified_held = 0
        self.stats = SpeculationStats()

    @property
    def launched(self) -> bool:
        """A step is being computed; `collect` returns its tokens."""
        return self._launched is not None

    def launch(self, draft_limit: int) -> None:
        """Start the step that feeds the pending token, with up to `draft_limit` draft tokens when there are any."""
        if self._launched is not None:
            raise RuntimeError("launch needs no step in flight")
        forced = self._forced(draft_limit)
        inputs = [*self.pending, *(forced or self._draft(draft_limit))]
        started = time.perf_counter()
        with mx.stream(generation_stream), STEP_CLOCK.part("graph"):
            logits = self._model(mx.array(inputs)[None], cache=self.cache)[0]
            samples = self._sample(inputs, logits)
        with STEP_CLOCK.part("launch"):
            mx.async_eval(samples)
        self._launched = _LaunchedStep(inputs=inputs, samples=samples, started=started, forced=bool(forced))

    def _forced(self, limit: int) -> list[int]:
        """Grammar fast-forward: the tokens the grammar forces after the pending one, fed as the draft. Verified like
        any draft (kept while the model's own masked choice agrees), so the output is the step-by-step output; a
        forced token is the only one its step allows, so it holds unless the model would split the same text into
        other tokens."""
        if not self._fast_forward or self._policy is None or limit <= 0 or not self._processors.constrained:
            return []
        forced = self._processors.forced_tokens(mx.array([*self.fed, *self.pending]))
        # Only where the measured pass costs say a longer pass pays (on some hardware it costs many short ones).
        return forced[: self._policy.forced_length(min(len(forced), limit))]

    def _draft(self, limit: int) -> list[int]:
        """The draft tokens to verify with the pending token: the lookup's proposal, cut where the grammar forbids
        it, as long as the policy expects to pay off."""
        if self._drafts is None or self._policy is None or limit <= 0:
            return []
        draft = self._drafts(limit)
        if draft and self._processors.constrained:
            context = mx.array([*self.fed, *self.pending])
            draft = draft[: self._processors.allowed_draft_length(context, draft)]
        if not draft:
            return []
        length = self._policy.draft_length(len(draft))
        if length == 0:
            self._policy.declined()
            if not self._unverified:
                self._unverified, self._unverified_held = draft[: self._policy.maximum], 0
        return draft[:length]

    def _check_unverified(self, produced: list[int]) -> None:
        """Compare the declined draft with the tokens written since; once it is decided, the policy learns from it."""
        if not self._unverified or self._policy is None:
            return
        for token in produced:
            if token != self._unverified[self._unverified_held]:
                break
            self._unverified_held += 1
            if self._unverified_held == len(self._unverified):
                break
        else:
            return  # every token so far matched and the draft goes on: undecided
        self._policy.observe(len(self._unverified), self._unverified_held)
        self._unverified, self._unverified_held = [], 0

    def collect(self) -> list[int]:
        """The launched step's tokens: the drafts the model agreed with, then its own next token."""
        step = self._launched
        if step is None:
            raise RuntimeError("no step in flight")
        self._launched = None
        with STEP_CLOCK.part("device"):
            samples: list[int] = step.samples.tolist()  # pyright: ignore[reportAssignmentType] -- 1-D token ids
        if self._times is not None:
            self._times.record(len(step.inputs), time.perf_counter() - step.started)
        draft = step.draft
        accepted = 0
        while accepted < len(draft) and samples[accepted] == draft[accepted]:
            accepted += 1
        rejected = len(draft) - accepted
        if rejected:
            trim_tokens(self.cache, rejected)
            self._processors.rollback(rejected)
        if draft and self._policy is not None and not step.forced:
            self._policy.record(len(draft), accepted)
        self.stats.steps += 1
        self.stats.drafted += len(draft)
        self.stats.accepted += accepted
        self.fed += step.inputs[: accepted + 1]
        self.pending = [samples[accepted]]
        produced = [*draft[:accepted], samples[accepted]]
        self._check_unverified(produced)
        return produced

    def _sample(self, inputs: list[int], logits: mx.array) -> mx.array:
        """The token after each position of `inputs`, each position processed as if decoded one at a time."""
        if not self._processors.empty:
            rows = [
                self._processors(mx.array([*self.fed, *inputs[: position + 1]]), logits[position : position + 1])
                for position in range(len(inputs))
            ]
            logits = mx.concatenate(rows, axis=0)
        return sample_rows(self._sampler, logits)
