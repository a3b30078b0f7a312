"""Walk a model and swap its matrix modules (Linear, Embedding and their quantized forms) one at a time: the
int8 and Q8_0 weight formats (`int8_layers.py`, `q8_layers.py`) both convert a model this way, so that each
original is released as soon as its replacement exists and loading never holds two copies of the model."""

from collections.abc import Callable
from typing import cast

import mlx.core as mx
from mlx import nn

Replacer = Callable[[nn.Module], nn.Module | None]
"""The replacement of a module, or None to leave it and look inside it."""
NamedReplacer = Callable[[str, nn.Module], nn.Module | None]
"""The same, given the module's path in the model too (`model.layers.0.mlp.up_proj`)."""


def replace_modules(model: nn.Module, replacement: Replacer) -> int:
    """Replace every module inside `model` that `replacement` gives a replacement for, depth first, one at a time;
    returns how many were replaced. Other parameters are left as they are (the caller sets their dtype)."""
    return replace_named_modules(model, lambda _path, module: replacement(module))


def replace_named_modules(model: nn.Module, replacement: NamedReplacer, prefix: str = "") -> int:
    """`replace_modules`, the replacement told each module's path (`prefix` and the names down to it)."""
    replaced = 0
    for name in list(model.children()):
        child = model[name]  # the module's own list, not children()'s copy of it
        if isinstance(child, list):
            for index, item in enumerate(cast(list[object], child)):
                if isinstance(item, nn.Module):
                    path = f"{prefix}{name}.{index}"
                    swapped = replacement(path, item)
                    if swapped is None:
                        replaced += replace_named_modules(item, replacement, f"{path}.")
                    else:
                        child[index] = swapped
                        replaced += 1
        elif isinstance(child, nn.Module):
            path = f"{prefix}{name}"
            swapped = replacement(path, child)
            if swapped is None:
                replaced += replace_named_modules(child, replacement, f"{path}.")
            else:
                setattr(model, name, swapped)
                replaced += 1
        del child
        mx.clear_cache()
    return replaced
