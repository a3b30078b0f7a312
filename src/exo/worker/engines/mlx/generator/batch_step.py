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
"""

from typing import cast

import mlx.core as mx
from mlx_lm.generate import GenerationBatch

from exo.worker.engines.mlx.generator.sampling import GREEDY, Sampler
from exo.worker.engines.mlx.step_clock import STEP_CLOCK


class LazyLogprobsBatch(GenerationBatch):
    """mlx-lm's generation batch, stepped without evaluating log-probabilities."""

    _joined: list[tuple[list[int], mx.array]]

    def extend(self, batch: GenerationBatch) -> None:
        if batch.uids:
            self._joined = [*getattr(self, "_joined", []), (list(batch.uids), cast(mx.array, batch._next_tokens))]  # pyright: ignore[reportPrivateUsage]
        super().extend(batch)

    def take_joined(self) -> list[tuple[int, int]]:
        """Each member that joined since the last call, with its first token (already sampled by the newcomers'
        own first step, whose forward pass this waits for); mlx-lm's next step returns the same token again."""
        joined = getattr(self, "_joined", [])
        self._joined = []
        taken: list[tuple[int, int]] = []
        for uids, tokens in joined:
            with STEP_CLOCK.part("device"):
                values = cast(list[int], tokens.tolist())
            taken += zip(uids, values, strict=True)
        return taken

    def _step(self) -> tuple[list[int], list[mx.array]]:
        self._current_tokens = self._next_tokens
        self._current_logprobs = self._next_logprobs
        inputs = cast(mx.array, self._current_tokens)

        with STEP_CLOCK.part("graph"):
            logits = self.model(inputs[:, None], cache=self.prompt_cache)[:, -1, :]
        token_context: list[mx.array] = []
        member_processors = self.logits_processors or []
        if any(member_processors):
            rows: list[mx.array] = []
            for index in range(len(self.uids)):
                row = logits[index : index + 1]
                processors = member_processors[index] or ()
                if processors:
                    context = self._token_context[index].update_and_fetch(inputs[index : index + 1])
                    token_context.append(context)
                    for processor in processors:
                        row = processor(context, row)
                rows.append(row)
            logits = mx.concatenate(rows, axis=0)

        with STEP_CLOCK.part("graph"):
            logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)  # lazy: evaluated only if read
            self._next_tokens = _sample(self._samplers(), logits, logprobs)
            self._next_logprobs = [logprobs[index] for index in range(len(self.uids))]
        with STEP_CLOCK.part("launch"):
            mx.async_eval(self._next_tokens, token_context)
        with STEP_CLOCK.part("device"):
            mx.eval(inputs)
        tokens = cast(list[int], inputs.tolist())
        for held, token in zip(self.tokens, tokens, strict=True):
            held.append(token)
        return tokens, self._current_logprobs

    def _samplers(self) -> list[Sampler]:
        given = cast(list[Sampler | None], self.samplers or [None] * len(self.uids))
        return [self.fallback_sampler if sampler is None else sampler for sampler in given]


def _sample(samplers: list[Sampler], logits: mx.array, logprobs: mx.array) -> mx.array:
    """Each row's token: the argmax of its logits for a greedy member, its sampler on its log-probabilities
    otherwise; one call for the whole batch when every member shares the sampler (as mlx-lm does)."""
    if all(sampler is samplers[0] for sampler in samplers):
        return mx.argmax(logits, axis=-1) if samplers[0] is GREEDY else samplers[0](logprobs)
    rows = [
        mx.argmax(logits[index : index + 1], axis=-1) if sampler is GREEDY else sampler(logprobs[index : index + 1])
        for index, sampler in enumerate(samplers)
    ]
    return mx.concatenate(rows, axis=0)
