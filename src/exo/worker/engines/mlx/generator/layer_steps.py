"""One forward pass run a few decoder layers at a time, so a long prefill piece can pause between layers.

On a CPU a forward pass over few tokens costs far more per token than one over hundreds (every pass reads all the
weights; docs/OPERATIONS.md, "Prefill in pieces"), so prefill wants large pieces, while a cancel, a new request and
the other requests' decode steps want the runner back every fraction of a second. A `SteppedPass` gets both: it
runs the model's own forward (any mlx-lm model, its mask and cache handling untouched) inside a greenlet, evaluates
the hidden state as it enters each decoder layer, and hands control back to the runner once its time slice is spent.
The next `advance` resumes the pass where it stopped; `abandon` ends it, leaving the layers it did not reach
untouched.

The pause point is a hook on the layers' class (`install_layer_steps`): a subclass swapped in under each layer, so
the parameter tree keeps its names and the model's forward keeps calling its layers as written. Outside a stepped
pass the hook only checks which greenlet is running.
"""

import time
from collections.abc import Callable
from typing import Any, cast

import mlx.core as mx
from greenlet import greenlet  # pyright: ignore[reportMissingTypeStubs]
from mlx import nn

_STEPPED_CLASSES: dict[type, type] = {}
"""Each decoder layer class to its stepped subclass, made once."""


class _PassGreenlet(greenlet):
    """The greenlet a stepped pass runs in; its layers pause it once `deadline` has passed."""

    def __init__(self, run: Callable[[], None]) -> None:
        super().__init__(run)
        self.deadline = 0.0
        self.layers_entered = 0

    def enter_layer(self, hidden: object) -> None:
        """A layer is about to run on `hidden`: compute everything before it, then pause if the slice is spent."""
        if isinstance(hidden, mx.array):
            mx.eval(hidden)
        self.layers_entered += 1
        if self.layers_entered == 1 or time.perf_counter() < self.deadline:
            return  # before the first layer only the embedding ran: nothing worth a pause
        ours = mx.default_stream(mx.default_device())
        parent = cast(greenlet, self.parent)
        parent.switch()
        mx.set_default_stream(ours)


def _stepped_class(layer_class: type) -> type:
    stepped = _STEPPED_CLASSES.get(layer_class)
    if stepped is None:
        original = cast(Callable[..., object], layer_class.__call__)

        def call(self: nn.Module, *args: Any, **kwargs: Any) -> object:
            current = greenlet.getcurrent()
            if isinstance(current, _PassGreenlet):
                current.enter_layer(args[0] if args else None)
            return original(self, *args, **kwargs)

        stepped = type(layer_class.__name__, (layer_class,), {"__call__": call, "__module__": layer_class.__module__})
        _STEPPED_CLASSES[layer_class] = stepped
        _STEPPED_CLASSES[stepped] = stepped
    return stepped


def install_layer_steps(model: nn.Module) -> int:
    """Let a stepped pass pause `model` between its decoder layers (`model.layers`); returns how many layers can.

    A model without a `layers` list of modules gets no pause points: its passes run whole.
    """
    layers: object = getattr(model, "layers", None)
    if not isinstance(layers, list):
        return 0
    count = 0
    for layer in cast(list[object], layers):
        if isinstance(layer, nn.Module):
            layer.__class__ = _stepped_class(type(layer))
            count += 1
    return count


class SteppedPass:
    """`forward` (one forward pass, evaluated inside) run a time slice at a time."""

    def __init__(self, forward: Callable[[], None]) -> None:
        self._greenlet = _PassGreenlet(forward)
        self.busy_seconds = 0.0
        """Time spent inside the pass so far, not counting its pauses."""

    @property
    def done(self) -> bool:
        return self._greenlet.dead

    @property
    def started(self) -> bool:
        return bool(self._greenlet) or self._greenlet.dead

    @property
    def layers_entered(self) -> int:
        return self._greenlet.layers_entered

    def advance(self, seconds: float) -> bool:
        """Run the pass for about `seconds` (it pauses at the first layer boundary after); True once it is done.

        An exception raised by the forward pass propagates from here, and the pass is then done.
        """
        if self.done:
            return True
        ours = mx.default_stream(mx.default_device())
        started = time.perf_counter()
        self._greenlet.deadline = started + seconds
        try:
            self._greenlet.switch()
        finally:
            self.busy_seconds += time.perf_counter() - started
            mx.set_default_stream(ours)
        return self.done

    def abandon(self) -> None:
        """End a paused pass where it stands: the layers it did not reach are never called."""
        if self.started and not self.done:
            ours = mx.default_stream(mx.default_device())
            self._greenlet.throw()
            mx.set_default_stream(ours)
