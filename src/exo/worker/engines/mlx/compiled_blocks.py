"""Decoder layers whose fixed-shape parts run as `mx.compile`d functions during decode steps.

A decode step's forward pass is dozens of small mlx operations a layer, each built from Python: a llama-family
layer calls its norm, three projections, three reshapes (and Qwen 3's two head norms), two ropes, the attention, the
output projection, a norm, the MLP and two residual adds. Where a step's device work takes a few milliseconds (an
accelerator, a small model), building that graph is a large part of the host's time a step (docs/PERFORMANCE.md,
issue 36's stand-in). Here the parts of a layer that do not depend on the cache's length run as two compiled
functions: before the attention (norm, projections, reshapes, head norms, rope with the cache's offset as an array)
and after it (output projection, residual, norm, MLP, residual); the cache update and the attention stay mlx-lm's own
calls. mlx replays a compiled function's traced graph in one call, and fuses its element-wise operations.

Only passes of at most `MAX_COMPILED_TOKENS` tokens a sequence take the compiled parts (decode steps, verification
passes, short prompts): a longer pass (a prefill piece) runs the layer as mlx-lm writes it. A shape that fails to
trace (an operation that evaluates inside, as the CPU engine's numpy SwiGLU does on large inputs) runs mlx-lm's layer
from then on.

Installed only on layers written exactly as mlx-lm's qwen2, qwen3 and llama decoder layers, with stock mlx modules
in them (no CPU-engine replacement, no sharded matrix), and only after a check at load that the compiled layer gives
the same bits as mlx-lm's for one token alone and for a left-padded batch of two: otherwise the layers stay as they
are. `EXO_COMPILED_BLOCKS=off` leaves every layer as mlx-lm writes it.
"""

import logging
import sys
from collections.abc import Callable, Mapping
from typing import Any, cast

import mlx.core as mx
from mlx import nn
from mlx_lm.models import llama, qwen2, qwen3
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import BatchKVCache, KVCache
from mlx_lm.models.rope_utils import Llama3RoPE

from exo.worker.engines.mlx.mixed_classes import mix_in, mix_out

logger = logging.getLogger(__name__)

COMPILED_BLOCKS_VARIABLE = "EXO_COMPILED_BLOCKS"
MAX_COMPILED_TOKENS = 16
"""A pass of more tokens a sequence (a prefill piece) runs the layer as mlx-lm writes it: its shapes vary from piece
to piece, each would be traced anew, and its graph-building time is small beside its compute."""

_BLOCKS: dict[type, tuple[type, type]] = {
    qwen2.TransformerBlock: (qwen2.Attention, qwen2.MLP),
    qwen3.TransformerBlock: (qwen3.Attention, qwen3.MLP),
    llama.TransformerBlock: (llama.Attention, llama.MLP),
}
"""The decoder layer classes whose forward `_CompiledParts` restates: layer class to (attention, MLP)."""
_HEAD_NORMS: frozenset[type] = frozenset({qwen3.TransformerBlock})
"""Layers whose attention normalizes each head's queries and keys (`q_norm`, `k_norm`) before the rope."""
_PROJECTIONS = (nn.Linear, nn.QuantizedLinear)
_ROPES = (nn.RoPE, Llama3RoPE)

_Pre = Callable[[mx.array, mx.array], tuple[mx.array, mx.array, mx.array]]
_Post = Callable[[mx.array, mx.array], mx.array]


class _CompiledParts:
    """One layer's two compiled functions, and the shapes that would not trace."""

    def __init__(self, layer: nn.Module) -> None:
        attention: Any = cast(Any, layer).self_attn
        block: Any = layer

        head_norms = _layer_class(type(layer)) in _HEAD_NORMS

        def before_attention(x: mx.array, offset: mx.array) -> tuple[mx.array, mx.array, mx.array]:
            batch, length, _ = x.shape
            normed = block.input_layernorm(x)
            queries = attention.q_proj(normed).reshape(batch, length, attention.n_heads, -1)
            keys = attention.k_proj(normed).reshape(batch, length, attention.n_kv_heads, -1)
            if head_norms:
                queries, keys = attention.q_norm(queries), attention.k_norm(keys)
            queries, keys = queries.transpose(0, 2, 1, 3), keys.transpose(0, 2, 1, 3)
            values = attention.v_proj(normed).reshape(batch, length, attention.n_kv_heads, -1).transpose(0, 2, 1, 3)
            return attention.rope(queries, offset=offset), attention.rope(keys, offset=offset), values

        def after_attention(x: mx.array, attended: mx.array) -> mx.array:
            batch, length, _ = x.shape
            hidden = x + attention.o_proj(attended.transpose(0, 2, 1, 3).reshape(batch, length, -1))
            return hidden + block.mlp(block.post_attention_layernorm(hidden))

        self.before: _Pre = cast(_Pre, mx.compile(before_attention))
        self.after: _Post = cast(_Post, mx.compile(after_attention))
        self.after_uncompiled: _Post = after_attention
        """mlx-lm's own operations for the part after the attention, where its shape would not trace (the cache was
        updated by then: the layer cannot start over)."""
        self.scale = cast(float, attention.scale)
        self.untraceable: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()

    def give_way(self, key: tuple[tuple[int, ...], tuple[int, ...]], error: Exception) -> None:
        """A shape that did not trace: mlx-lm's layer runs it from now on."""
        self.untraceable.add(key)
        logger.debug("compiled block: shape %s runs mlx-lm's layer (%s)", key, error)


_PARTS_ATTRIBUTE = "_exo_compiled_parts"


class _CompiledCall(nn.Module):
    """The call of a decoder layer with compiled parts (`mix_in`): `_compiled_call`."""

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        return _compiled_call(self, x, mask, cache)


def _stock_call(layer: nn.Module, x: mx.array, mask: Any, cache: Any) -> mx.array:
    return cast(mx.array, _layer_class(type(layer)).__call__(layer, x, mask, cache))


def _layer_class(cls: type) -> type:
    """The mlx-lm layer class under `cls` (itself, or the class a mixed-in or stepped subclass derives from)."""
    for base in cls.__mro__:
        if base in _BLOCKS:
            return base
    raise TypeError(f"{cls.__name__} is not a decoder layer compiled blocks support")


def _compiled_call(layer: nn.Module, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
    parts = cast(_CompiledParts | None, layer.__dict__.get(_PARTS_ATTRIBUTE))
    if parts is None or cache is None or x.shape[1] > MAX_COMPILED_TOKENS:
        return _stock_call(layer, x, mask, cache)
    offset = cache.offset
    offsets = offset if isinstance(offset, mx.array) else mx.array(offset, dtype=mx.int32)
    key = (tuple(x.shape), tuple(offsets.shape))
    if key in parts.untraceable:
        return _stock_call(layer, x, mask, cache)
    try:
        queries, keys, values = parts.before(x, offsets)
    except (ValueError, RuntimeError) as error:
        parts.give_way(key, error)
        return _stock_call(layer, x, mask, cache)
    keys, values = cache.update_and_fetch(keys, values)
    # Looked up at call time: the CPU engine may re-point the layer module's attention (`cpu/kernels.py`).
    attention = vars(sys.modules[type(layer).__module__])["scaled_dot_product_attention"]
    attended = attention(queries, keys, values, cache=cache, scale=parts.scale, mask=mask)
    try:
        return parts.after(x, attended)
    except (ValueError, RuntimeError) as error:
        parts.give_way(key, error)
        return parts.after_uncompiled(x, attended)


def why_not_compiled(layer: object) -> str | None:
    """Why `layer` cannot take compiled parts (None where it can): its class and its modules' must be exactly the
    ones `_CompiledParts` restates."""
    layer_class = type(layer)
    if layer_class not in _BLOCKS:
        if any(base in _BLOCKS for base in layer_class.__mro__):
            return "its class is replaced (another engine runs its steps)"
        return f"{layer_class.__module__}.{layer_class.__name__} layers are not among those compiled"
    attention_class, mlp_class = _BLOCKS[layer_class]
    block: Any = layer
    modules: Mapping[str, tuple[object, tuple[type, ...]]] = {
        "self_attn": (block.self_attn, (attention_class,)),
        "mlp": (block.mlp, (mlp_class,)),
        "input_layernorm": (block.input_layernorm, (nn.RMSNorm,)),
        "post_attention_layernorm": (block.post_attention_layernorm, (nn.RMSNorm,)),
        "rope": (block.self_attn.rope, _ROPES),
        **{name: (getattr(block.self_attn, name), _PROJECTIONS) for name in ("q_proj", "k_proj", "v_proj", "o_proj")},
        **{name: (getattr(block.mlp, name), _PROJECTIONS) for name in ("gate_proj", "up_proj", "down_proj")},
        **{name: (getattr(block.self_attn, name), (nn.RMSNorm,)) for name in _head_norm_names(layer_class)},
    }
    for name, (module, classes) in modules.items():
        if type(module) not in classes:
            return f"its {name} is a {type(module).__name__}"
    return None


def _head_norm_names(layer_class: type) -> tuple[str, ...]:
    return ("q_norm", "k_norm") if layer_class in _HEAD_NORMS else ()


def _same_as_stock(layer: nn.Module) -> bool:
    """Whether the compiled parts give mlx-lm's bits on `layer`: one token after three cached alone, and one token
    a sequence for a left-padded batch of two (its mask and per-sequence offsets), outputs and caches alike."""
    parts = cast(_CompiledParts, layer.__dict__[_PARTS_ATTRIBUTE])
    weight = cast(mx.array, cast(Any, layer).input_layernorm.weight)
    width = weight.shape[0]
    key = mx.random.key(0)
    prompt_key, step_key = mx.random.split(key)
    prompt = mx.random.normal((2, 3, width), key=prompt_key).astype(weight.dtype)
    step = mx.random.normal((2, 1, width), key=step_key).astype(weight.dtype)
    for batched in (False, True):
        rows = 2 if batched else 1
        outputs: list[mx.array] = []
        caches: list[Any] = []
        for compiled in (False, True):
            cache: Any = BatchKVCache(left_padding=[0, 1]) if batched else KVCache()
            _stock_call(layer, prompt[:rows], create_attention_mask(prompt[:rows], cache), cache)
            mask = create_attention_mask(step[:rows], cache)
            call = _compiled_call if compiled else _stock_call
            outputs.append(call(layer, step[:rows], mask, cache))
            caches.append(cache)
        if parts.untraceable:  # the compiled call fell back to mlx-lm's layer: nothing was compared
            return False
        stock_state, compiled_state = (cast(list[mx.array], cache.state) for cache in caches)
        if not mx.array_equal(outputs[0], outputs[1]).item():
            return False
        if not all(mx.array_equal(a, b).item() for a, b in zip(stock_state, compiled_state, strict=True)):
            return False
    return True


def install_compiled_blocks(model: nn.Module, environment: Mapping[str, str]) -> str:
    """Give `model`'s decoder layers (`model.layers`) compiled parts where all of them can take them and the check at
    load finds the same bits; returns what was done, for the runner's log."""
    if environment.get(COMPILED_BLOCKS_VARIABLE, "").strip() == "off":
        return f"compiled blocks off ({COMPILED_BLOCKS_VARIABLE}=off)"
    layers: object = getattr(model, "layers", None)
    if not isinstance(layers, list) or not layers:
        return "compiled blocks off (the model has no list of decoder layers)"
    blocks = cast(list[nn.Module], layers)
    for index, layer in enumerate(blocks):
        reason = why_not_compiled(layer)
        if reason is not None:
            return f"compiled blocks off (layer {index}: {reason})"
    for layer in blocks:
        layer.__dict__[_PARTS_ATTRIBUTE] = _CompiledParts(layer)
        mix_in(layer, _CompiledCall)
    try:
        same = _same_as_stock(blocks[0])
    except Exception as error:  # an optimisation never fails a load: the layers stay mlx-lm's
        remove_compiled_blocks(model)
        return f"compiled blocks off (their check at load failed: {type(error).__name__}: {error})"
    if not same:
        remove_compiled_blocks(model)
        return "compiled blocks off (their check at load found other bits than mlx-lm's layer)"
    return f"compiled blocks: {len(blocks)} decoder layers (mx.compile; {COMPILED_BLOCKS_VARIABLE}=off turns them off)"


def compiled_layers(model: nn.Module) -> int:
    """How many of `model`'s decoder layers run compiled parts."""
    layers: object = getattr(model, "layers", None)
    if not isinstance(layers, list):
        return 0
    return sum(1 for layer in cast(list[nn.Module], layers) if _PARTS_ATTRIBUTE in layer.__dict__)


def remove_compiled_blocks(model: nn.Module) -> int:
    """Put `model`'s layers back as mlx-lm writes them (before anything replaces their modules, which the compiled
    parts would otherwise go on calling as traced); returns how many were compiled."""
    layers: object = getattr(model, "layers", None)
    if not isinstance(layers, list):
        return 0
    count = 0
    for layer in cast(list[nn.Module], layers):
        if layer.__dict__.pop(_PARTS_ATTRIBUTE, None) is not None:
            count += 1
            # A subclass over the mixed-in one (a prefill's pause points) stays: without parts it calls mlx-lm's.
            mix_out(layer, _CompiledCall)
    return count
