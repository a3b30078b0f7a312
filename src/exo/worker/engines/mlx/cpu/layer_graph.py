"""A decoder layer's pass over several tokens — a prefill piece, a draft's verification, a group prefill's batch —
as one ggml graph (issue 33), as llama.cpp computes a prompt.

Through mlx-lm's layer with ggml's products inside, a 512-token prefill piece of the default model spent most of its
time outside the products (measured on a 2-core EPYC: the numpy softmax attention 40%, mlx's evaluation of norms and
rope before each product 20%, the products 35%; docs/PERFORMANCE.md). Here the whole layer — norms, q/k/v with
their biases, rope, attention over the cached and new positions under the pass's mask, o_proj, the SwiGLU MLP, the
residual adds — is one graph over the model's own ggml matrices (`DecodeGraph.layer`, shared with the decode step),
with attention as ggml's flash attention (`ggml_flash_attn_ext`, as llama-server runs it on a CPU), over float32
keys and values: the scores are never written out whole, so a long context costs no memory for them (measured on
the 2-core EPYC, one layer's attention for 512 new tokens after 4,096 cached took 118 ms, against 310 ms as a
masked softmax between two float32 products; docs/PERFORMANCE.md).

The model's forward still calls its layers one by one, so a prefill pass still pauses between layers
(`layer_steps.py`), and the KV cache stays mlx-lm's: the graph reads each layer's cached keys and values where mlx
holds them, and the pass's new ones are appended through `update_and_fetch` after, as mlx-lm's attention appends
them.
"""

from dataclasses import dataclass
from typing import Final, cast

import mlx.core as mx
import numpy as np
import numpy.typing as npt
from mlx import nn
from mlx_lm.models.cache import BatchKVCache, KVCache

from exo.worker.engines.mlx.cache.owned_kv_cache import is_plain_kv_cache
from exo.worker.engines.mlx.cpu.decode_graph import (
    I32,
    DecodeGraph,
    cache_view,
    for_cache,
    read_floats,
    write_int32,
)
from exo.worker.engines.mlx.cpu.ggml_library import GGML_TYPES
from exo.worker.engines.mlx.cpu.ggml_repack import READ_BACK_ROWS
from exo.worker.engines.mlx.mixed_classes import mix_in

_F32: Final = GGML_TYPES["F32"]
_F16: Final = GGML_TYPES["F16"]
_LAYER_NODES: Final = 64
"""Graph nodes a layer's pass makes (about 40)."""
_OUTSIDE_TENSORS: Final = 16
"""Tensors over memory the graph does not allocate: the input, the mask, the cache views and up to seven matrices
read back (`stored_layout.py`)."""


class LayerPass:
    """Layer `index` of a model's `DecodeGraph` over any number of tokens of one sequence (mlx-lm's `KVCache`) or
    several (a left-padded `BatchKVCache`)."""

    def __init__(self, graph: DecodeGraph, index: int) -> None:
        self._graph = graph
        self._index = index

    def __call__(self, x: mx.array, mask: object, cache: object) -> mx.array | None:
        """The layer's output for hidden states `x` (batch × tokens × hidden, float32), with the tokens' keys and
        values appended to `cache`; None, with nothing done, where this pass does not compute the call exactly as
        mlx-lm's layer would (another cache or mask kind, another dtype)."""
        inputs = _inputs(x, mask, cache)
        if inputs is None:
            return None
        ops, shape = self._graph.ops, self._graph.shape
        batch, tokens, hidden = x.shape
        count = batch * tokens
        keys, values = inputs.keys, inputs.values
        context = ops.new_context(
            _LAYER_NODES * int(ops.ggml.tensor_overhead()) + int(ops.ggml.graph_overhead()), allocates=False
        )
        outside = ops.new_context(_OUTSIDE_TENSORS * int(ops.ggml.tensor_overhead()), allocates=False)
        try:
            hidden_in = ops.new_tensor_1d(outside, _F32, count * hidden)
            ops.set_data(hidden_in, inputs.hidden.ctypes.data)
            x_in = ops.reshape_2d(context, hidden_in, hidden, count)
            positions = ops.new_tensor_1d(context, I32, count)
            ops.set_input(positions)
            mask_tensor = None
            if inputs.mask is not None:
                rows = inputs.mask.shape[-2]
                mask_tensor = ops.new_tensor_4d(outside, _F16, inputs.context, rows, 1, inputs.mask.shape[0])
                ops.set_data(mask_tensor, inputs.mask.ctypes.data)
            cached = None
            if keys is not None and values is not None:
                cached = (
                    cache_view(ops, context, outside, keys, inputs.held),
                    cache_view(ops, context, outside, values, inputs.held),
                )

            def attend(q: int, k: int, v: int) -> int:
                return self._graph.attention(
                    context,
                    q=q,
                    k=k,
                    v=v,
                    cached=cached,
                    mask=mask_tensor,
                    batch=batch,
                    tokens=tokens,
                )

            out, new_keys, new_values = self._graph.layer(
                context,
                self._index,
                x_in,
                tokens=count,
                positions=positions,
                attend=attend,
                stored_in=outside if count >= READ_BACK_ROWS else None,
            )
            graph = ops.new_graph_custom(context, _LAYER_NODES, False)
            for output in (out, new_keys, new_values):
                ops.set_output(output)
                ops.build_forward_expand(graph, output)
            self._graph.allocate(graph)
            write_int32(ops.get_data(positions), inputs.positions)
            self._graph.compute(graph)
            result = read_floats(ops.get_data(out), count * hidden).reshape(batch, tokens, hidden)
            k = read_floats(ops.get_data(new_keys), count * shape.kv_width)
            v = read_floats(ops.get_data(new_values), count * shape.kv_width)
        finally:
            ops.free(outside)
            ops.free(context)
        del inputs
        cache_ = cast(KVCache | BatchKVCache, cache)
        cache_.update_and_fetch(for_cache(k, shape, batch, tokens), for_cache(v, shape, batch, tokens))
        return mx.array(result)


@dataclass(frozen=True)
class _Inputs:
    """A call's arrays as the graph reads them (numpy views of mlx's memory where they can be)."""

    hidden: npt.NDArray[np.float32]
    keys: npt.NDArray[np.float32] | None
    values: npt.NDArray[np.float32] | None
    held: int
    """Positions the cache holds before the pass (a batch's left padding included)."""
    positions: list[int]
    mask: npt.NDArray[np.float16] | None
    """Float16, 0 or -inf, batch (or 1) × 1 × tokens × context, or None (every key visible)."""
    tokens: int

    @property
    def context(self) -> int:
        return self.held + self.tokens


def _inputs(x: mx.array, mask: object, cache: object) -> _Inputs | None:
    if x.ndim != 3 or x.dtype != mx.float32:
        return None
    batch, tokens, _ = x.shape
    if is_plain_kv_cache(cache):
        if batch != 1:
            return None
        held = cache.offset
        starts = [held]
    elif type(cache) is BatchKVCache:
        held = cast(int, cache._idx)  # pyright: ignore[reportPrivateUsage]
        starts = cast(list[int], cast(mx.array, cache.offset).tolist())
        if len(starts) != batch:
            return None
    else:
        return None
    keys, values = cache.keys, cache.values
    if held > 0 and (keys is None or values is None):
        return None
    additive = _additive_mask(mask, batch=batch, tokens=tokens, held=held)
    if isinstance(additive, bool):
        return None
    if held > 0 and keys is not None and values is not None:
        mx.eval(x, keys, values)
        key_view, value_view = np.asarray(keys), np.asarray(values)
        if not (_fits(key_view, batch, held) and _fits(value_view, batch, held)):
            return None
    else:
        mx.eval(x)
        key_view = value_view = None
    hidden = np.ascontiguousarray(np.asarray(x), dtype=np.float32)
    positions = [start + t for start in starts for t in range(tokens)]
    return _Inputs(
        hidden=hidden,
        keys=key_view,
        values=value_view,
        held=held,
        positions=positions,
        mask=additive,
        tokens=tokens,
    )


def _fits(array: npt.NDArray[np.float32], batch: int, held: int) -> bool:
    """mlx's cache buffer as the graph reads it: float32, batch × kv heads × capacity × head dim, each position's
    values side by side."""
    return (
        array.dtype == np.float32
        and array.ndim == 4
        and array.shape[0] == batch
        and array.shape[2] >= held
        and array.strides[3] == 4
        and min(array.strides[:3]) >= 4 * array.shape[3]
    )


def _additive_mask(mask: object, *, batch: int, tokens: int, held: int) -> npt.NDArray[np.float16] | bool | None:
    """mlx-lm's mask as flash attention takes it: float16, 0 where a key is seen and -inf where not, (batch or 1) × 1
    × tokens × context; None for no mask; False for a mask this pass does not take. (A row with every key hidden, a
    batch's left padding, comes out zero where mlx averages the values: no position of a sequence attends to its
    padding, so nothing reads either.)"""
    context = held + tokens
    if mask is None:
        return None
    if isinstance(mask, str):
        if mask != "causal":
            return False
        rows = np.arange(tokens)[:, None]
        columns = np.arange(context)[None, :]
        allowed = (columns <= held + rows).reshape(1, 1, tokens, context)
    elif not isinstance(mask, mx.array) or mask.dtype != mx.bool_:
        return False
    elif mask.ndim == 2 and mask.shape == (tokens, context):
        allowed = np.asarray(mask).reshape(1, 1, tokens, context)
    elif mask.ndim == 4 and mask.shape[0] in (1, batch) and mask.shape[1:] == (1, tokens, context):
        allowed = np.asarray(mask)
    else:
        return False
    return np.where(allowed, np.float16(0), np.float16(-np.inf))


class _LayerGraphCall(nn.Module):
    """The call of a decoder layer with a `LayerPass` installed (`install_layer_passes`): a pass the graph computes
    runs as it; any other call is the layer's own."""

    layer_pass: LayerPass

    def __call__(self, x: mx.array, mask: object = None, cache: object = None) -> mx.array:
        out = self.layer_pass(x, mask, cache)
        if out is not None:
            return out
        return cast(mx.array, super().__call__(x, mask, cache))  # pyright: ignore[reportUnknownMemberType]


def install_layer_passes(model: nn.Module, graph: DecodeGraph) -> int:
    """Make each decoder layer of `model` run its multi-token passes as `graph`'s layer (its class becomes a
    subclass of its own that dispatches them: isinstance checks, parameter names and the layer-step pauses stay);
    returns how many layers were."""
    inner = model.get("model")
    layers = cast(list[nn.Module], inner.get("layers") if isinstance(inner, nn.Module) else [])
    if len(layers) != graph.layers:
        return 0
    for index, layer in enumerate(layers):
        mix_in(layer, _LayerGraphCall)
        cast(_LayerGraphCall, layer).layer_pass = LayerPass(graph, index)
    return len(layers)
