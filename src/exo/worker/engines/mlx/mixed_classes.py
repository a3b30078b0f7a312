"""A module's own class with a mixin's call in front: how exo's engines take over a model's or a layer's call."""

from mlx import nn

_SUBCLASSES: dict[tuple[type, type], type] = {}
"""Each (mixin, module class) to the subclass of both `mix_in` made, once."""


def mix_in(module: nn.Module, mixin: type) -> None:
    """Make `module` an instance of a subclass of `mixin` and of its own class, so the mixin's `__call__` runs
    first: isinstance checks, parameter names and every attribute stay as they were."""
    base = type(module)
    if (mixin, base) not in _SUBCLASSES:
        _SUBCLASSES[mixin, base] = type(base.__name__, (mixin, base), {"__module__": base.__module__})
    module.__class__ = _SUBCLASSES[mixin, base]


def mix_out(module: nn.Module, mixin: type) -> None:
    """Undo `mix_in(module, mixin)`: `module` back in its own class. A module whose class `mix_in` did not make with
    `mixin` (never mixed, or subclassed again since) stays as it is."""
    mixed = type(module)
    base = mixed.__bases__[-1]
    if _SUBCLASSES.get((mixin, base)) is mixed:
        module.__class__ = base
