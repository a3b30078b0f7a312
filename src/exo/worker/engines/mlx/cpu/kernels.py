"""A prefill's two large element-wise steps on a CPU, in numpy: the attention softmax and the SwiGLU gate.

mlx's CPU backend runs element-wise kernels one element at a time. A prefill chunk's attention scores hold
heads × chunk × context values (25 M for a 512-token chunk at 3.5k tokens of context on a 14-head model), and
there mlx's softmax costs several times the two matmuls around it: it is most of a long prompt's prefill (an
agent's first request, with its 7k-token system prompt). The MLP's `silu(gate) * up` over chunk × intermediate
values is the next largest. numpy's vectorised loops do both, on the same float32 values, faster (measured figures,
per step and machine, are in docs/PERFORMANCE.md and docs/OPERATIONS.md).
The matmuls stay in mlx; the softmax is written into the scores' own buffer, so nothing is copied.
A decode step (a few query rows, one stream's or a left-padded batch's) over a long cache takes the same path:
there mlx's softmax over heads × context scores is most of its attention (0.47 of 0.79 ms a layer at 2,000 cached
tokens, numpy's 0.02 ms; measured in docs/PERFORMANCE.md, "Decode attention over a long context"). Short contexts,
small prefill chunks and what these paths do not cover (a prefill's array masks, a decode step's additive ones;
attention sinks, quantized caches, other dtypes) keep mlx's kernels.
"""

import sys
from collections.abc import Callable, Collection
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models import activations, base

from exo.shared.types.cpu_kernels import Replacement

# Below this many values mlx's own kernels are as fast (a prefill chunk's scores).
MIN_SCORES = 1 << 20
# A decode step (at most DECODE_ROWS query rows: one token, a speculation's verify) comes here from this many cached
# tokens on. The attention alone gains from 256 on, but a whole gguf step (the extra evaluation of the scores in the
# middle of the layer) measured even at 500 and 2,000 and faster at 4,000 and 8,000 (docs/PERFORMANCE.md).
DECODE_ROWS = 16
MIN_DECODE_CONTEXT = 2048
MIN_GATE_VALUES = 1 << 20
# mlx-lm's own functions, kept before any module is re-pointed (also `activations`, whose SwiGLU layer uses it).
MLX_ATTENTION = base.scaled_dot_product_attention
MLX_SWIGLU = activations.swiglu
_LOWEST = float(np.finfo(np.float32).min)


def numpy_softmax_attention(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    scale: float,
    *,
    causal: bool,
    allowed: mx.array | None = None,
) -> mx.array:
    """softmax(q·kᵀ·scale [+ causal mask]) · v for float32 (batch, heads, length, dim) arrays, grouped-query too.

    The causal mask is mlx's: query i of L sees the keys up to position S − L + i of S. `allowed`, a boolean mask
    of shape (length, S) or (batch or 1, 1, length, S) (mlx-lm's batch caches' left padding), hides the keys where
    it is False.
    """
    batch, query_heads, length, dim = queries.shape
    kv_heads, context = keys.shape[1], keys.shape[2]
    groups = query_heads // kv_heads
    grouped = (queries * scale).reshape(batch, kv_heads, groups * length, dim)
    scores = grouped @ keys.swapaxes(-1, -2)
    mx.eval(scores) if allowed is None else mx.eval(scores, allowed)
    # A view of the freshly evaluated scores, which nothing else holds: the softmax replaces them in place.
    view = np.asarray(scores).reshape(batch, kv_heads, groups, length, context)
    if causal and length > 1:
        rows, columns = np.triu_indices(length, 1)
        view[..., rows, context - length + columns] = _LOWEST
    if allowed is not None:
        hidden = np.logical_not(np.asarray(allowed))
        np.copyto(view, _LOWEST, where=hidden if hidden.ndim == 2 else hidden[:, :, None])
    np.subtract(view, view.max(axis=-1, keepdims=True), out=view)
    np.exp(view, out=view)
    np.divide(view, view.sum(axis=-1, keepdims=True), out=view)
    return (scores @ values).reshape(batch, query_heads, length, dim)


def _boolean_mask(mask: Any, queries: mx.array, keys: mx.array) -> bool:
    """Whether `mask` is a boolean array numpy_softmax_attention takes: (L, S), or (B or 1, 1, L, S) as mlx-lm's
    batch caches make it (their left padding)."""
    if not isinstance(mask, mx.array) or mask.dtype != mx.bool_:
        return False
    length, context = queries.shape[2], keys.shape[2]
    if mask.ndim == 2:
        return mask.shape == (length, context)
    return mask.ndim == 4 and mask.shape[0] in {1, queries.shape[0]} and mask.shape[1:] == (1, length, context)


def _covers(queries: mx.array, keys: mx.array, cache: Any, mask: Any, sinks: Any) -> bool:
    causal_or_none = mask is None or (isinstance(mask, str) and mask == "causal")
    if sinks is not None or hasattr(cache, "bits"):
        return False
    if queries.dtype != mx.float32 or keys.dtype != mx.float32 or queries.shape[1] % keys.shape[1]:
        return False
    batch, heads, length, _ = queries.shape
    context = keys.shape[2]
    if causal_or_none and length > 1 and batch * heads * length * context >= MIN_SCORES:
        return True
    # A decode step: one stream's (no mask, or causal over a verify's rows) or a batch's (its padding mask).
    few_rows = length <= DECODE_ROWS and context >= MIN_DECODE_CONTEXT
    return few_rows and (causal_or_none or _boolean_mask(mask, queries, keys))


def scaled_dot_product_attention(  # noqa: PLR0917 - mlx-lm's models call it with these positional arguments
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    cache: Any,
    scale: float,
    mask: Any,
    sinks: Any = None,
) -> mx.array:
    """mlx-lm's `scaled_dot_product_attention`, with the numpy softmax where it covers the call."""
    if _covers(queries, keys, cache, mask, sinks):
        if isinstance(mask, mx.array):
            return numpy_softmax_attention(queries, keys, values, scale, causal=False, allowed=mask)
        return numpy_softmax_attention(queries, keys, values, scale, causal=mask is not None)
    return MLX_ATTENTION(queries, keys, values, cache, scale, mask, sinks)


def swiglu(gate: mx.array, x: mx.array) -> mx.array:
    """mlx-lm's `swiglu` (silu(gate) · x, x being the MLP's up projection), in numpy for a float32 prefill chunk."""
    if gate.dtype != mx.float32 or x.dtype != mx.float32 or gate.shape != x.shape or gate.size < MIN_GATE_VALUES:
        return MLX_SWIGLU(gate, x)
    mx.eval(gate, x)
    result = np.array(gate)  # a copy: silu(g) = g / (1 + e^-g), computed into it
    denominator = np.negative(result)
    with np.errstate(over="ignore"):  # e^-g overflows to inf for g < -88: silu is then -0, as it should be
        np.exp(denominator, out=denominator)
    denominator += 1
    np.divide(result, denominator, out=result)
    result *= np.asarray(x)
    return mx.array(result)


# Each replacement: the name mlx-lm's model modules import, mlx-lm's function and this module's.
_REPLACEMENTS: dict[Replacement, tuple[str, Callable[..., mx.array], Callable[..., mx.array]]] = {
    "numpy_attention": ("scaled_dot_product_attention", MLX_ATTENTION, scaled_dot_product_attention),
    "numpy_swiglu": ("swiglu", MLX_SWIGLU, swiglu),
}


def use_numpy_kernels(replacements: Collection[Replacement]) -> None:
    """Route mlx-lm's attention and/or SwiGLU (those of `replacements` this module has) through this module.

    Every mlx-lm model module imports these functions by name, so each loaded one is re-pointed (a runner process
    holds one model, so process-wide is the model's scope).
    """
    chosen = [_REPLACEMENTS[name] for name in replacements if name in _REPLACEMENTS]
    for name, module in list(sys.modules.items()):
        if not name.startswith("mlx_lm.models."):
            continue
        for attribute, original, replacement in chosen:
            if getattr(module, attribute, None) is original:
                vars(module)[attribute] = replacement
