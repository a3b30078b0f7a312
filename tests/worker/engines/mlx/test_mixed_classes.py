"""`mix_in` puts a mixin's call in front of a module's own class; `mix_out` takes exactly that back."""

from typing import Any

import mlx.core as mx
from mlx import nn

from exo.worker.engines.mlx.mixed_classes import mix_in, mix_out


class _Doubled(nn.Module):
    def __call__(self, x: mx.array) -> mx.array:
        own: Any = super()
        return own.__call__(x) * 2


def test_mix_out_restores_the_modules_own_class() -> None:
    layer = nn.Linear(2, 2)
    x = mx.ones((1, 2))
    plain = layer(x)
    mix_in(layer, _Doubled)
    assert isinstance(layer, nn.Linear)
    assert isinstance(layer, _Doubled)
    assert mx.array_equal(layer(x), plain * 2).item()
    mix_out(layer, _Doubled)
    assert type(layer) is nn.Linear
    assert mx.array_equal(layer(x), plain).item()


def test_mix_out_leaves_other_classes_alone() -> None:
    never_mixed = nn.Linear(2, 2)
    mix_out(never_mixed, _Doubled)
    assert type(never_mixed) is nn.Linear

    subclassed_again = nn.Linear(2, 2)
    mix_in(subclassed_again, _Doubled)
    over = type("Over", (type(subclassed_again),), {})
    subclassed_again.__class__ = over
    mix_out(subclassed_again, _Doubled)
    assert type(subclassed_again) is over
