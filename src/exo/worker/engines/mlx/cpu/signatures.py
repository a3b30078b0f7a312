"""The mlx-lm and mlx functions the CPU engine replaces or overrides, each with the signature (parameter names and
defaults) its replacement was written for, checked when this module is imported.

A replacement written against another version's function could crash or, worse, compute something else quietly.
Where a function's signature differs from the one recorded here (or the function is gone), the replacement that
depends on it is turned off with a warning and mlx-lm's own function serves. The recorded signatures are mlx-lm
0.32's (the range pyproject.toml allows).
"""

import inspect
import logging
from collections.abc import Callable
from typing import NamedTuple

import mlx_lm.utils
from mlx import nn
from mlx_lm.models import activations, base

from exo.shared.types.cpu_kernels import Replacement

logger = logging.getLogger(__name__)


class WrittenFor(NamedTuple):
    """`owner.name` had `signature` when `replacement` was written against it."""

    replacement: Replacement
    owner: object
    name: str
    signature: str


WRITTEN_FOR: tuple[WrittenFor, ...] = (
    WrittenFor("float32", mlx_lm.utils, "dequantize_model", "(model)"),
    WrittenFor(
        "numpy_attention",
        base,
        "scaled_dot_product_attention",
        "(queries, keys, values, cache, scale, mask, sinks=None)",
    ),
    WrittenFor("numpy_swiglu", activations, "swiglu", "(gate, x)"),
    WrittenFor("matmul_plan", nn.Linear, "__call__", "(self, x)"),
    WrittenFor("matmul_plan", nn.Embedding, "as_linear", "(self, x)"),
)


def signature_of(function: Callable[..., object]) -> str:
    """Parameter names, kinds and defaults, without annotations (which change spelling between versions)."""
    signature = inspect.signature(function)
    bare = [parameter.replace(annotation=inspect.Parameter.empty) for parameter in signature.parameters.values()]
    return str(signature.replace(parameters=bare, return_annotation=inspect.Signature.empty))


def mismatches(written_for: tuple[WrittenFor, ...] = WRITTEN_FOR) -> dict[Replacement, str]:
    """Why each replacement whose functions changed must stay off (a warning logged for each)."""
    found: dict[Replacement, str] = {}
    for expected in written_for:
        function: object = getattr(expected.owner, expected.name, None)
        actual = signature_of(function) if callable(function) else "missing"
        if actual != expected.signature and expected.replacement not in found:
            owner = getattr(expected.owner, "__name__", type(expected.owner).__name__)
            found[expected.replacement] = f"{owner}.{expected.name} is {actual}, written for {expected.signature}"
            logger.warning("CPU kernels: %s turned off: %s", expected.replacement, found[expected.replacement])
    return found


MISMATCHES = mismatches()
"""The replacements this process's mlx-lm cannot take, decided once at import."""
