"""One step of mlx-lm's generation batch without the vocabulary-wide normalization nobody reads.

mlx-lm's `GenerationBatch._step` normalizes every member's logits to log-probabilities (a `logsumexp` over batch x
vocabulary) and evaluates them every step, whether or not anything reads them. On mlx's CPU backend that cost more
than the forward pass itself (docs/PERFORMANCE.md: 33-43 ms for 8 x 151,936 logits against 9-24 ms for the pass).
Here a greedy member takes the argmax of its logits (the same token: normalizing subtracts one constant per row),
a sampled member is still sampled from normalized log-probabilities (exactly as alone, `solo.py`), and each
member's log-probabilities stay available as a lazy array: computed exactly, and only, if something evaluates it.
A joining member's first step is still mlx-lm's own (mlx-lm builds it in a generation batch of the newcomers and
merges that into this one): one normalization of the newcomers' rows per join, not per step. That first step has
already sampled each newcomer's first token when it joins; the batch keeps it (`take_joined`) so it can be handed
out at once rather than a whole batch step later, when mlx-lm's own step returns it.

Overlap of a join (`JoinPrompts`, with `overlap` on): mlx-lm moves the newcomers out of its prompt batch with a
`split` whose cache filter reads the padding back (a wait for the running members' pass, launched just before), then
builds the newcomers' first forward pass, calls their processors, and launches pass, masks and sample together. Here
a split that moves every member hands the batch over without that filter, and the newcomers' pass is launched as
soon as it is built (`_LaunchedPass`), so a grammar's first mask (which needs only the prompt, never that pass) is
computed while both passes run. The arithmetic is mlx-lm's own, so the newcomers' first tokens are the same. The
scheduler reads those tokens only after `settle` (`BatchDecoder.take_joined`), so that reading's wait comes after
the running members' masks.

Overlap under a grammar: mlx-lm builds a step's forward pass, then calls each member's processors on the token that
pass feeds, then launches pass, masks and sample together. A grammar reads that token (the sample of the step before,
so it waits for it) and computes its mask on the host before anything of the step is launched: the device idles while
every constrained member's mask is computed. With `overlap` on, a step with a constrained member launches its forward
pass alone (`mx.async_eval` of the logits), hands back the tokens it feeds, and leaves its sample unlaunched
(`_Unsampled`); `settle` then feeds each member's processors its token and masks and samples the logits while the pass
may still run. The scheduler calls `settle` after it accepted those tokens and took out the members that ended or went
back with them, so a grammar is never fed the token that ended its request (as `SoloDecoder.settle_chained`). Members
that join in between (sampled by their own first step) keep their tokens; members taken out lose their rows.
"""

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import mlx.core as mx
from mlx import nn
from mlx_lm.generate import GenerationBatch, PromptProcessingBatch

from exo.worker.engines.mlx.cpu.decode_graph import decode_graph_of
from exo.worker.engines.mlx.generator.beside import AfterLaunch, launch
from exo.worker.engines.mlx.generator.processors import RequestProcessors
from exo.worker.engines.mlx.generator.sampling import GREEDY, Sampler, greedy_rows, read_tokens
from exo.worker.engines.mlx.step_clock import STEP_CLOCK


@dataclass(frozen=True)
class _Unsampled:
    """A step whose forward pass was launched without its sample: the batch's first rows (the members then in it)."""

    logits: mx.array
    """The pass's last-position logits, one row per member, before any processor."""
    inputs: mx.array
    """The token each row fed (evaluated: already handed back)."""


class _LaunchedPass(nn.Module):
    """The model, its output launched (`mx.async_eval`) as soon as the pass is built: the processors mlx-lm calls
    next compute their masks on the host while the pass runs."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.inner = model

    def __call__(self, inputs: mx.array, cache: list[object]) -> mx.array:
        logits = cast(mx.array, self.inner(inputs, cache=cache))
        launch(logits)
        return logits


@dataclass
class JoinLaunches:
    constrained: int = 0
    """Joins with a constrained newcomer whose first forward pass was launched before the newcomers' masks."""


class JoinPrompts(PromptProcessingBatch):
    """mlx-lm's batch of prompts being read, whose newcomers' first step (`generate`) launches its forward pass before
    the newcomers' processors are called, where `overlap` is on and a newcomer has any (see the module's docstring)."""

    overlap: bool = False
    launches: "JoinLaunches"
    """Shared with the batches `split` copies off this one (mlx-lm generates from those)."""

    @classmethod
    def for_joining(
        cls, model: nn.Module, fallback_sampler: Sampler, *, prefill_step_size: int, overlap: bool
    ) -> "JoinPrompts":
        batch = cls.empty(model, fallback_sampler, prefill_step_size=prefill_step_size)
        batch.overlap = overlap
        batch.launches = JoinLaunches()
        return batch

    def _copy(self) -> "JoinPrompts":
        # mlx-lm's `split` copies the batch (its own attributes only) and generates from the copy.
        copy = cast(JoinPrompts, super()._copy())  # pyright: ignore[reportUnknownMemberType]
        copy.overlap = self.overlap
        copy.launches = self.launches
        return copy

    def split(self, indices: list[int]) -> "JoinPrompts":
        if not self.overlap or sorted(indices) != list(range(len(self.uids))):
            return cast(JoinPrompts, super().split(indices))
        # Every member moves on to decode (exo's members join with only their last token left): the batch is handed
        # over whole. mlx-lm would copy it and filter the copy to all of its rows, and that filter reads the caches'
        # padding back (`tolist`): it waits for the running members' forward pass, launched just before, so the
        # newcomers' first step, and their masks, would start only once that pass is done.
        moved = copy.copy(self)
        self.uids, self.prompt_cache, self.tokens = [], [], []
        self.samplers, self.logits_processors, self.max_tokens, self.stop_sequences = [], [], [], []
        return moved

    def generate(self, tokens: list[list[int]]) -> GenerationBatch:
        # Only a last token per newcomer: with more, mlx-lm first reads the rest as prompt, whose logits nobody reads.
        processors = cast(list[list[object]], self.logits_processors)
        if not self.overlap or not any(processors) or any(len(last) != 1 for last in tokens):
            return super().generate(tokens)
        model = self.model
        self.model = _LaunchedPass(model)
        try:
            generation = super().generate(tokens)
        finally:
            self.model = model
        if any(
            isinstance(processor, RequestProcessors) and processor.constrained
            for member in processors
            for processor in member
        ):
            self.launches.constrained += 1
        return generation


class LazyLogprobsBatch(GenerationBatch):
    """mlx-lm's generation batch, stepped without evaluating log-probabilities."""

    _joined: list[tuple[list[int], mx.array]]
    _unsampled: _Unsampled | None = None
    overlap: bool = False
    """Launch a step with a constrained member before its masks, computed in `settle` (see the module's docstring)."""
    read_ahead: Callable[[list[int], list[int]], AfterLaunch] | None = None
    """Called with the members' uids and the tokens a step feeds (the last step's sample, waited for) once that step's
    forward pass is built, before it is launched: a caller accepts them while the launch computes, and what it returns
    is called once the launch returns (`beside.py`)."""

    @classmethod
    def for_decoding(
        cls,
        model: nn.Module,
        fallback_sampler: Sampler,
        *,
        overlap: bool,
        read_ahead: Callable[[list[int], list[int]], AfterLaunch] | None = None,
    ) -> "LazyLogprobsBatch":
        batch = cls.empty(model, fallback_sampler)
        batch.overlap = overlap
        batch.read_ahead = read_ahead
        return batch

    def extend(self, batch: GenerationBatch) -> None:
        if batch.uids:
            self._joined = [*getattr(self, "_joined", []), (list(batch.uids), cast(mx.array, batch._next_tokens))]  # pyright: ignore[reportPrivateUsage]
        # With a step unsampled, `_next_tokens` holds only rows that joined since (None before): mlx-lm appends the
        # newcomers' tokens to it, and `settle` puts the sampled rows in front.
        super().extend(batch)

    def filter(self, keep: list[int]) -> None:
        unsampled = self._unsampled
        if unsampled is None:
            super().filter(keep)
            return
        rows = unsampled.logits.shape[0]
        own = [index for index in keep if index < rows]
        joined = [index - rows for index in keep if index >= rows]
        joined_tokens, joined_logprobs = self._next_tokens, self._next_logprobs
        # mlx-lm's filter picks the kept rows of the next tokens: stand-ins for the rows not sampled yet.
        self._next_tokens = mx.zeros((len(self.uids),), dtype=mx.uint32)
        self._next_logprobs = [self._next_tokens] * len(self.uids)
        super().filter(keep)
        self._next_tokens = joined_tokens[mx.array(joined)] if joined and joined_tokens is not None else None
        self._next_logprobs = [joined_logprobs[index] for index in joined]
        self._unsampled = (
            _Unsampled(logits=unsampled.logits[mx.array(own)], inputs=unsampled.inputs[mx.array(own)]) if own else None
        )

    def take_joined(self) -> list[tuple[int, int]]:
        """Each member that joined since the last call, with its first token (already sampled by the newcomers'
        own first step, whose forward pass this waits for); mlx-lm's next step returns the same token again."""
        joined = getattr(self, "_joined", [])
        self._joined = []
        taken: list[tuple[int, int]] = []
        for uids, tokens in joined:
            taken += zip(uids, read_tokens(tokens), strict=True)
        return taken

    def settle(self) -> bool:
        """Sample the step launched without its sample: each member's processors are fed the token its row fed and
        mask its logits (a grammar's mask computed on the host while the forward pass may still run), then the
        sample is launched. False where no step waited for it."""
        unsampled = self._unsampled
        if unsampled is None:
            return False
        self._unsampled = None
        rows = unsampled.logits.shape[0]
        logits, token_context = self._processed(unsampled.logits, unsampled.inputs)
        with STEP_CLOCK.part("graph"):
            logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)  # lazy: evaluated only if read
            sampled = _sample(self._samplers()[:rows], logits, logprobs, on_host=self._on_host)
            joined = self._next_tokens
            self._next_tokens = sampled if joined is None else mx.concatenate([sampled, joined])
            self._next_logprobs = [*(logprobs[index] for index in range(rows)), *self._next_logprobs]
        launch(self._next_tokens, token_context)
        return True

    def _constrained(self) -> bool:
        return any(
            isinstance(processor, RequestProcessors) and processor.constrained
            for processors in self.logits_processors or []
            for processor in processors or ()
        )

    def _processed(self, logits: mx.array, inputs: mx.array) -> tuple[mx.array, list[mx.array]]:
        """The first `len(logits)` members' logits after their processors, shown their tokens so far then `inputs`;
        and the token contexts to evaluate with the sample."""
        token_context: list[mx.array] = []
        member_processors = (self.logits_processors or [])[: logits.shape[0]]
        if not any(member_processors):
            return logits, token_context
        rows: list[mx.array] = []
        for index, processors in enumerate(member_processors):
            row = logits[index : index + 1]
            if processors:
                context = self._token_context[index].update_and_fetch(inputs[index : index + 1])
                token_context.append(context)
                for processor in processors:
                    row = processor(context, row)
            rows.append(row)
        return mx.concatenate(rows, axis=0), token_context

    def _step(self) -> tuple[list[int], list[mx.array]]:
        self.settle()  # a step left unsampled (the scheduler settles it after accepting its tokens)
        self._current_tokens = self._next_tokens
        self._current_logprobs = self._next_logprobs
        inputs = self._current_tokens
        assert inputs is not None  # sampled by the step before, or by `settle`

        with STEP_CLOCK.part("graph"):
            logits = self.model(inputs[:, None], cache=self.prompt_cache)[:, -1, :]
        if self.overlap and self._constrained():
            # The forward pass alone: the masks need the tokens it feeds, accepted first (`settle`).
            tokens, after = self._read_ahead(inputs)
            launch(logits, after=after)
            self._unsampled = _Unsampled(logits=logits, inputs=inputs)
            self._next_tokens = None
            self._next_logprobs = []
        else:
            logits, token_context = self._processed(logits, inputs)
            with STEP_CLOCK.part("graph"):
                logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)  # lazy: evaluated only if read
                self._next_tokens = _sample(self._samplers(), logits, logprobs, on_host=self._on_host)
                self._next_logprobs = [logprobs[index] for index in range(len(self.uids))]
            tokens, after = self._read_ahead(inputs)
            launch(self._next_tokens, token_context, after=after)
        if tokens is None:
            tokens = read_tokens(inputs)
        for held, token in zip(self.tokens, tokens, strict=True):
            held.append(token)
        return tokens, self._current_logprobs

    def _read_ahead(self, inputs: mx.array) -> tuple[list[int] | None, AfterLaunch | None]:
        """Where a caller accepts them beside the launch (`read_ahead`): the tokens this step feeds, read once its graph
        is built (the wait for the step before overlaps the building) and before the launch, and what to call once the
        launch returns; (None, None) otherwise."""
        if self.read_ahead is None:
            return None, None
        tokens = read_tokens(inputs)
        return tokens, self.read_ahead(list(self.uids), tokens)

    @property
    def _on_host(self) -> bool:
        """The model's steps run on the host synchronously (the CPU engine's decode graph): a greedy pick reads their
        logits there (`greedy_rows`)."""
        return decode_graph_of(self.model) is not None

    def _samplers(self) -> list[Sampler]:
        given = cast(list[Sampler | None], self.samplers or [None] * len(self.uids))
        return [self.fallback_sampler if sampler is None else sampler for sampler in given]


def _sample(samplers: list[Sampler], logits: mx.array, logprobs: mx.array, *, on_host: bool) -> mx.array:
    """Each row's token: the argmax of its logits for a greedy member (`greedy_rows`: `on_host` where the model's
    step runs on the host), its sampler on its log-probabilities otherwise; one call for the whole batch when every
    member shares the sampler (as mlx-lm does)."""
    if all(sampler is samplers[0] for sampler in samplers):
        return greedy_rows(logits, on_host=on_host) if samplers[0] is GREEDY else samplers[0](logprobs)
    rows = [
        greedy_rows(logits[index : index + 1], on_host=on_host)
        if sampler is GREEDY
        else sampler(logprobs[index : index + 1])
        for index, sampler in enumerate(samplers)
    ]
    return mx.concatenate(rows, axis=0)
