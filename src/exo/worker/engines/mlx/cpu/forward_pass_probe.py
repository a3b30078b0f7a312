"""One forward pass of a whole model over a few tokens, as a decode step makes it, to be timed.

The matmul plan is chosen from each weight shape's products timed alone. Inside a forward pass the same products
run between attention, norms and the other shapes' products, with other data in the caches, and a layout that won
alone can lose there (measured with MKL on an Intel Xeon: the plan's 4-row products each won alone, and the 4-token
pass was 7% slower with them than without). So the planner also times whole passes with and without the plan
(`matmul_planner.py`); this module makes those passes.
"""

import mlx.core as mx
from mlx import nn

from exo.worker.engines.mlx.cache.layer_cache import (
    PromptCache,
    can_trim,
    new_prompt_cache,
    trim_tokens,
)

CONTEXT_TOKENS = 64
"""Tokens already in the cache when a probed pass runs: attention has some context to read, as in a decode step."""


class ForwardPassProbe:
    """Feeds the model a few tokens after a short cached context, then drops them again, leaving the cache as it was.

    The cache is made and filled by `prepare` (one short prefill, kept apart from the timed passes), so making a
    probe costs nothing.
    """

    def __init__(self, model: nn.Module, context_tokens: int = CONTEXT_TOKENS) -> None:
        self._model = model
        self._context_tokens = context_tokens
        self._cache: PromptCache | None = None

    @classmethod
    def for_model(cls, model: nn.Module) -> "ForwardPassProbe | None":
        """A probe for `model`, or None where its cache cannot drop the tokens a pass adds (recurrent layers, say)."""
        return cls(model) if can_trim(new_prompt_cache(model)) else None

    @property
    def prepared(self) -> bool:
        """Whether the context is in the cache."""
        return self._cache is not None

    def prepare(self) -> None:
        """Fill the cache with the context."""
        cache = new_prompt_cache(self._model)
        mx.eval(self._model(_token_ids(self._context_tokens, start=0), cache=cache))
        self._cache = cache

    def run(self, rows: int) -> None:
        """One forward pass over `rows` tokens, evaluated."""
        if self._cache is None:
            self.prepare()
        assert self._cache is not None
        mx.eval(self._model(_token_ids(rows, start=self._context_tokens), cache=self._cache))
        trim_tokens(self._cache, rows)

    def release(self) -> None:
        """Drop the cache (`prepare` makes a new one)."""
        self._cache = None


def _token_ids(count: int, start: int) -> mx.array:
    """`count` token ids in a batch of one: which ids does not matter for timing, only how many (the first 256 ids
    exist in any vocabulary)."""
    return (mx.arange(start, start + count, dtype=mx.int32) % 256)[None]
