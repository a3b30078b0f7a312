"""Decoding one sequence with the model to itself (its prompt already prefilled): one forward pass per step that also
checks prompt-lookup drafts.

A step feeds the pending token plus any draft tokens, samples at every position and keeps the drafts up to the first
one that differs from the model's own choice, plus that choice: one to `len(draft) + 1` tokens per forward pass.
Greedy output is token for token the output without drafts, since every kept token is the argmax given exactly the
tokens before it. The cache and the grammar are rolled back past the rejected drafts.

Like mlx-lm's `generate_step`, the next step can be launched (`mx.async_eval`) on the lazily sampled token of the
step in flight, before that token is read (`chain`): the device goes from one step to the next without waiting for
the host, and the caller's work on a step's token (detokenizing, parsing, sending) overlaps the next forward pass.
Under a grammar the chained step's forward pass is launched alone (it needs no mask); once the step before it was
collected and its token accepted, the grammar is fed that token and computes the next mask on the host while the
pass runs, and only then is the chained step's sample launched (`settle_chained`), in the serial loop's order.
A step is chained only where its input does not depend on the host: no draft in either step (a draft comes from the
tokens, and a verified draft's pending token is known only once the model's choices are read), no forced tokens or
verified draft due after the token in flight (known once it is read: the step after the chained one is then launched
serially, fast-forwarding or verifying from there), a cache that can drop the chained token again. The lazy "auto"
grammar needs no case of its own: before its trigger its mask allows any token and is computed like any other, and
what the trigger forces is fast-forwarded as above. When the request ends (or goes back) with the step before it, the
chained step is discarded (`discard_chained`): its token is dropped from the cache, which is then exactly what the
step-by-step loop leaves, and the grammar never saw the token that ended the request.
"""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import mlx.core as mx
from mlx import nn
from mlx_lm.generate import generation_stream

from exo.worker.engines.mlx.cache.layer_cache import PromptCache, can_trim, trim_tokens
from exo.worker.engines.mlx.cpu.decode_graph import decode_graph_of
from exo.worker.engines.mlx.generator.beside import AfterLaunch, launch
from exo.worker.engines.mlx.generator.draft_policy import DraftPolicy, PassTimes, StepCosts
from exo.worker.engines.mlx.generator.processors import RequestProcessors
from exo.worker.engines.mlx.generator.sampling import Sampler, SeededSampler, read_tokens, sample_rows
from exo.worker.engines.mlx.step_clock import STEP_CLOCK

DraftSource = Callable[[int], list[int]]
"""Given a limit, draft tokens to follow the last generated token (an empty list for none)."""


@dataclass(frozen=True)
class _Sampling:
    """A step whose tokens are being sampled."""

    samples: mx.array
    """The model's token after each input (one per position), still being computed."""


@dataclass(frozen=True)
class _AwaitingMask:
    """A chained step under a grammar: its forward pass runs, its sample waits for the grammar's mask
    (`settle_chained`)."""

    logits: mx.array


@dataclass(frozen=True)
class _LaunchedStep:
    inputs: list[int] | None
    """The pending token, then the draft; None for a chained step, whose one input is the token the step before it
    samples (the pending token once that step is collected)."""
    output: _Sampling | _AwaitingMask
    started: float
    """`time.perf_counter()` when it was launched."""
    forced: bool = False
    """The draft is what the grammar forces (not a prompt-lookup guess the policy should learn from)."""

    @property
    def draft(self) -> list[int]:
        return self.inputs[1:] if self.inputs is not None else []


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
        self._on_host = decode_graph_of(model) is not None
        """The model's steps run on the host synchronously: a greedy pick reads their logits there (`greedy_rows`)."""
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
        self._launched: list[_LaunchedStep] = []
        """The steps in flight, oldest first: one, or two once a step is chained behind the first."""
        self._unverified: list[int] = []
        """A draft the policy declined, checked against the tokens the model goes on to write: whether it would have
        held is learned for free, so a request that starts copying is noticed without verifying anything."""
        self._unverified_held = 0
        self._wants_draft = drafts is not None
        """The last draft looked up after a token was one the policy verifies, or the grammar forces tokens after it:
        the next step is launched after that token is handled, with them, rather than chained without (`can_chain`)."""
        self.stats = SpeculationStats()

    @property
    def launched(self) -> bool:
        """A step is being computed; `collect` returns its tokens."""
        return bool(self._launched)

    def launch(self, draft_limit: int) -> None:
        """Start the step that feeds the pending token, with up to `draft_limit` draft tokens when there are any."""
        if self._launched:
            raise RuntimeError("launch needs no step in flight")
        forced = self._forced(draft_limit)
        inputs = [*self.pending, *(forced or self._draft(draft_limit))]
        started = time.perf_counter()
        with mx.stream(generation_stream), STEP_CLOCK.part("graph"):
            logits = self._model(mx.array(inputs)[None], cache=self.cache)[0]
            samples = self._sample(inputs, logits)
        launch(samples)
        self._launched.append(
            _LaunchedStep(inputs=inputs, output=_Sampling(samples), started=started, forced=bool(forced))
        )

    def can_chain(self) -> bool:
        """Whether the next step's input is the lazily sampled token of the step in flight: one plain step in flight
        (no draft), sampled (a chained step under a grammar is once settled), the last draft looked up not one the
        policy verifies and no tokens forced after it (a request copying from its prompt keeps verifying drafts,
        one in a grammar's fixed text keeps fast-forwarding: its next step waits for its token), and a cache that can
        drop a discarded step's token."""
        if len(self._launched) != 1 or self._wants_draft:
            return False
        step = self._launched[0]
        if (step.inputs is not None and len(step.inputs) != 1) or not isinstance(step.output, _Sampling):
            return False
        return can_trim(self.cache)

    def chain(self, read_ahead: Callable[[list[int]], AfterLaunch] | None = None) -> None:
        """Launch the next step on the token the step in flight is sampling, before that token is read (`can_chain`
        must hold). The caller handles the first step's token while both compute, then calls `settle_chained`;
        `discard_chained` takes the second back where the request ends or goes back with the first.

        `read_ahead`, where given, is called with the first step's tokens (what `collect` returns next, waited for)
        after the second step is built and before it is launched: the wait overlaps the building, and the caller
        accepts them while the launch computes; what it returns is called once the launch returns (`beside.py`)."""
        if not self.can_chain():
            raise RuntimeError("this step cannot be chained")
        previous = self._launched[0]
        assert isinstance(previous.output, _Sampling)
        in_flight = previous.output.samples
        token = in_flight.astype(mx.int32)  # as `launch` feeds its tokens

        def before_launch() -> AfterLaunch | None:
            # A plain step (`can_chain`): no draft, its own token.
            return None if read_ahead is None else read_ahead(read_tokens(in_flight)[:1])

        started = time.perf_counter()
        if self._processors.constrained:
            # The mask needs the token being sampled: the forward pass runs now, the mask and the sample follow in
            # `settle_chained`, computed on the host while this pass runs.
            with mx.stream(generation_stream), STEP_CLOCK.part("graph"):
                logits = self._model(token[None], cache=self.cache)[0]
            launch(logits, after=before_launch())
            self._launched.append(_LaunchedStep(inputs=None, output=_AwaitingMask(logits), started=started))
            return
        with mx.stream(generation_stream), STEP_CLOCK.part("graph"):
            logits = self._model(token[None], cache=self.cache)[0]
            if not self._processors.empty:  # penalties only (no grammar): what they are shown, as step by step
                # The previous step's input: its own token, or (chained too) the pending token it feeds.
                fed = [*self.fed, *(previous.inputs if previous.inputs is not None else self.pending)]
                context = mx.concatenate([mx.array(fed), token])
                logits = self._processors(context, logits)
            samples = sample_rows(self._sampler, logits, on_host=self._on_host)
        launch(samples, after=before_launch())
        self._launched.append(_LaunchedStep(inputs=None, output=_Sampling(samples), started=started))

    def settle_chained(self, draft_limit: int) -> None:
        """After the token before the chained step in flight was collected and handled: under a grammar, feed it that
        token, mask the chained step's logits and launch its sample (the forward pass may still be running); then
        look up what `launch` would have fed with it (`look_up_draft`)."""
        if len(self._launched) != 1 or self._launched[0].inputs is not None:
            raise RuntimeError("only a chained step, once the step before it was collected, is settled")
        step = self._launched[0]
        if isinstance(step.output, _AwaitingMask):
            with mx.stream(generation_stream), STEP_CLOCK.part("graph"):
                logits = self._processors(mx.array([*self.fed, *self.pending]), step.output.logits)
                samples = sample_rows(self._sampler, logits, on_host=self._on_host)
            launch(samples)
            self._launched[0] = replace(step, output=_Sampling(samples))
        self.look_up_draft(draft_limit)

    def discard_chained(self) -> None:
        """Take back the chained step still in flight once the step before it was collected (the request ended or
        went back with that step; nothing when no step is in flight): its token leaves the cache and a seeded
        sampler's draw is given back, as if it had never been launched."""
        if not self._launched:
            return
        if len(self._launched) > 1 or self._launched[0].inputs is not None:
            raise RuntimeError("only a chained step, collected after the step before it, is discarded")
        step = self._launched.pop()
        if trim_tokens(self.cache, 1) != 1:
            raise RuntimeError("the chained step's token could not be dropped from the cache")
        if isinstance(step.output, _Sampling) and isinstance(
            self._sampler, SeededSampler
        ):  # unsettled: it drew nothing
            self._sampler.draws -= 1

    def look_up_draft(self, draft_limit: int) -> None:
        """After the token before a chained step was handled: the forced tokens or the draft `launch` would have
        looked up for that step. Forced tokens, or a draft the policy would verify, stop the chaining, so the step
        after is launched with them (fast-forward and speculation as step by step, one token later); a draft the
        policy declines is booked as declined (compared with what the model writes, counted towards exploring)."""
        if self._forced(draft_limit):
            self._wants_draft = True
            return
        draft = self._proposal(draft_limit)
        if not draft:
            self._wants_draft = False
        elif self._policy is not None and self._policy.draft_length(len(draft)) == 0:
            self._wants_draft = False
            self._decline(draft)
        else:
            self._wants_draft = True

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
        draft = self._proposal(limit)
        if not draft:
            self._wants_draft = False
            return []
        length = self._policy.draft_length(len(draft))
        self._wants_draft = length > 0
        if length == 0:
            self._decline(draft)
        return draft[:length]

    def _proposal(self, limit: int) -> list[int]:
        """The lookup's draft after the pending token, cut where the grammar forbids it (empty without speculation)."""
        if self._drafts is None or self._policy is None or limit <= 0:
            return []
        draft = self._drafts(limit)
        if draft and self._processors.constrained:
            context = mx.array([*self.fed, *self.pending])
            draft = draft[: self._processors.allowed_draft_length(context, draft)]
        return draft

    def _decline(self, draft: list[int]) -> None:
        assert self._policy is not None
        self._policy.declined()
        if not self._unverified:
            self._unverified, self._unverified_held = draft[: self._policy.maximum], 0

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
        if not self._launched:
            raise RuntimeError("no step in flight")
        step = self._launched.pop(0)
        if not isinstance(step.output, _Sampling):
            raise RuntimeError("a chained step is collected once settled")
        inputs = step.inputs if step.inputs is not None else list(self.pending)
        samples = read_tokens(step.output.samples)
        collected = time.perf_counter()
        if self._times is not None:
            self._times.record(len(inputs), collected - step.started)
        if self._launched:
            # The chained step had the device only from now: its pass is timed from here, not from its launch.
            self._launched[0] = replace(self._launched[0], started=collected)
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
        self.fed += inputs[: accepted + 1]
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
        return sample_rows(self._sampler, logits, on_host=self._on_host)
