"""A request's logits processors as one mlx-lm processor that fails only its own request.

In a batch, mlx-lm calls every member's processors inside one generation step: an exception from one member's grammar
would abort the step for all of them. `RequestProcessors` catches it, leaves that member's logits alone and keeps
the error, and the scheduler then fails that one request and removes it from the batch.

Penalties come first and the grammar constraint last, so the constraint sees (and masks) the final logits. Both
kinds work under prompt-lookup speculation: the penalties are pure functions of the tokens they are shown, and the
grammar can check a draft and take back tokens the model rejected.
"""

from collections.abc import Sequence

import mlx.core as mx

from exo.worker.engines.mlx.constrained import ToolCallLogitsProcessor
from exo.worker.engines.mlx.generator.sampling import LogitsProcessor
from exo.worker.engines.mlx.step_clock import STEP_CLOCK


class RequestProcessors:
    """Penalty processors, then the grammar constraints, for one request."""

    def __init__(self, penalties: Sequence[LogitsProcessor], constraints: Sequence[ToolCallLogitsProcessor]) -> None:
        self._penalties = tuple(penalties)
        self._constraints = tuple(constraints)
        self.error: Exception | None = None
        """The first exception a processor raised; the request must fail with it."""

    @property
    def empty(self) -> bool:
        """No processor at all: mlx-lm can skip the per-member processing step entirely."""
        return not self._penalties and not self._constraints

    @property
    def constrained(self) -> bool:
        return bool(self._constraints)

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        """`logits` after every processor; unchanged once a processor has failed (the request is being failed)."""
        if self.error is not None:
            return logits
        try:
            with STEP_CLOCK.part("processors"):
                for penalty in self._penalties:
                    logits = penalty(tokens, logits)
                for constraint in self._constraints:
                    logits = constraint(tokens, logits)
        except Exception as error:
            self.error = error
        return logits

    def allowed_draft_length(self, tokens: mx.array, draft: list[int]) -> int:
        """How much of `draft` (proposed to follow `tokens`) every constraint allows."""
        allowed = len(draft)
        try:
            with STEP_CLOCK.part("processors"):
                for constraint in self._constraints:
                    allowed = min(allowed, constraint.allowed_draft_length(tokens, draft[:allowed]))
        except Exception as error:
            self.error = error
            return 0
        return allowed

    def forced_tokens(self, tokens: mx.array) -> list[int]:
        """The tokens the grammar constraints force after `tokens` (empty without a constraint or a failed one)."""
        if not self._constraints or self.error is not None:
            return []
        try:
            with STEP_CLOCK.part("processors"):
                forced = self._constraints[0].forced_tokens(tokens)
            return forced[: self.allowed_draft_length(tokens, forced)] if forced else []
        except Exception as error:
            self.error = error
            return []

    def rollback(self, num_tokens: int) -> None:
        """Take back the last `num_tokens` tokens the constraints consumed (drafts the model rejected)."""
        try:
            for constraint in self._constraints:
                constraint.rollback(num_tokens)
        except Exception as error:
            self.error = error
