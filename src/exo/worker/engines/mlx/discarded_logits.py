"""Forward passes whose logits are thrown away (a prefill piece only fills the cache), told to the layers that can
skip the output head. The generator sets it; the CPU's quantized layers read it. Neither depends on the other."""

from collections.abc import Generator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Final

import mlx.core as mx

_LOGITS_DISCARDED: Final = ContextVar("exo_logits_discarded", default=False)


@contextmanager
def logits_discarded() -> Generator[None]:
    """Within this block the output head of a model served by ggml's products (an `output_head` Q8Linear, a tied
    Q8Embedding's `as_linear`) computes nothing and returns zeros of its shape, unevaluated: for forward passes whose
    logits are thrown away, as a prefill piece's are (it only fills the cache). A float32 model's head is lazy and
    never runs there; a ggml product runs when called, so without this a 512-token piece multiplied all 512 rows by
    the 151,936-row output matrix (13-20 % of a gguf prefill, docs/PERFORMANCE.md section 12). A context variable,
    so it holds only in the context (the greenlet of a stepped prefill pass) that set it, never in a decode step
    run between two of the pass's layers."""
    token = _LOGITS_DISCARDED.set(True)
    try:
        yield
    finally:
        _LOGITS_DISCARDED.reset(token)


def discarded_logits(x: mx.array, out_features: int) -> mx.array | None:
    """Zeros in place of the head's product inside `logits_discarded`, else None."""
    if not _LOGITS_DISCARDED.get():
        return None
    return mx.zeros((*x.shape[:-1], out_features), dtype=mx.float32)


def logits_are_discarded() -> bool:
    """Whether this context is inside `logits_discarded`."""
    return _LOGITS_DISCARDED.get()
