"""Few-row float32 products laid out the way this machine's BLAS computes them fastest.

A decode step multiplies a handful of rows (one per batched sequence, or per draft token being verified) by every
weight matrix. mlx computes a Linear layer as ``x @ Wᵀ``; how a CPU BLAS handles that skinny product depends on its
layout. Measured with MKL on x86: over 3 to 8 rows ``x @ Wᵀ`` switched to a GEMM that repacks the whole weight
matrix on every call (about 2x the cost of one row), while ``(W @ xᵀ)ᵀ`` streamed the weights once; and on an AMD
CPU one row (a matrix-vector kernel) took longer than two. Which layout wins, and whether padding a product to a
few more zero rows pays, differs by CPU and library, so the runner measures it per weight shape after loading, and
again a little at a time while idle (`matmul_planner.py`); the model's Linear layers consult the plan on every call.

The layers here compute the same product as mlx's, in another order of summation: results agree to float32
rounding, not bit for bit.
"""

from collections.abc import Mapping
from typing import Literal

import mlx.core as mx
from mlx import nn

from exo.shared.types.common import FrozenModel

Layout = Literal["rows_first", "weights_first"]
"""`rows_first`: ``x @ Wᵀ`` (mlx's own); `weights_first`: ``(W @ xᵀ)ᵀ``."""

LAYOUTS: tuple[Layout, ...] = ("rows_first", "weights_first")

DEVIATION_MARGIN = 0.05
"""A choice other than mlx's own product must measure this much faster for each way it differs (layout, padding):
differences smaller than timing noise are not worth leaving the path every other mlx user runs."""


class RowChoice(FrozenModel):
    """How to multiply `rows` rows: in `layout`, padded with zero rows to `computed_rows`."""

    layout: Layout
    computed_rows: int


class ShapePlan(FrozenModel):
    """The choice for each row count from 1 to ``len(choices)``; more rows than that keep mlx's own product."""

    choices: tuple[RowChoice, ...]

    def for_rows(self, rows: int) -> RowChoice | None:
        """The choice for `rows` rows, or None where mlx's own product is the choice."""
        if not 1 <= rows <= len(self.choices):
            return None
        choice = self.choices[rows - 1]
        # Called by every planned layer on every forward pass: compare fields rather than build a model to compare.
        mlx_own = choice.layout == "rows_first" and choice.computed_rows == rows
        return None if mlx_own else choice


def choose_shape_plan(seconds: Mapping[tuple[Layout, int], float], max_rows: int) -> ShapePlan:
    """The cheapest way to compute each row count, from measured `seconds` per (layout, rows) for rows 1..max_rows.

    A row count may be computed as a larger one (padded), so r rows cost at most what any r' ≥ r costs. Each way a
    candidate differs from mlx's own product counts against it by `DEVIATION_MARGIN`.
    """
    choices: list[RowChoice] = []
    for rows in range(1, max_rows + 1):

        def weighted(candidate: RowChoice, rows: int = rows) -> float:
            deviations = (candidate.layout != "rows_first") + (candidate.computed_rows != rows)
            return seconds[(candidate.layout, candidate.computed_rows)] * (1 + DEVIATION_MARGIN * deviations)

        candidates = [
            RowChoice(layout=layout, computed_rows=computed)
            for computed in range(rows, max_rows + 1)
            for layout in LAYOUTS
        ]
        choices.append(min(candidates, key=weighted))
    return ShapePlan(choices=tuple(choices))


def planned_product(x: mx.array, weight: mx.array, choice: RowChoice) -> mx.array:
    """``x @ weightᵀ`` over x's leading dimensions, computed as `choice` says."""
    rows = choice.computed_rows
    flat = x.reshape(-1, x.shape[-1])
    present = flat.shape[0]
    if rows > present:
        flat = mx.concatenate([flat, mx.zeros((rows - present, flat.shape[1]), dtype=flat.dtype)])
    product = flat @ weight.T if choice.layout == "rows_first" else (weight @ flat.T).T
    if rows > present:
        product = product[:present]
    return product.reshape(*x.shape[:-1], weight.shape[0])


class PlanSlot:
    """The current plan of one weight shape, shared by every layer of that shape: replacing `plan` (as the runner's
    idle-time refinement does) changes how all of them compute their next product."""

    def __init__(self, plan: ShapePlan) -> None:
        self.plan = plan


class PlannedLinear(nn.Linear):
    """A Linear layer (same parameters, same results to rounding) whose few-row products follow its shape's plan."""

    def __init__(self, linear: nn.Linear, slot: PlanSlot) -> None:
        nn.Module.__init__(self)
        self.weight = linear.weight
        if "bias" in linear:
            self.bias = linear.bias
        self.slot = slot

    def __call__(self, x: mx.array) -> mx.array:
        choice = self.slot.plan.for_rows(x.size // x.shape[-1])
        if choice is None:
            return super().__call__(x)
        product = planned_product(x, self.weight, choice)
        return product + self.bias if "bias" in self else product


class PlannedEmbedding(nn.Embedding):
    """An Embedding whose use as the output projection (tied weights) follows its shape's plan."""

    def __init__(self, embedding: nn.Embedding, slot: PlanSlot) -> None:
        nn.Module.__init__(self)
        self.weight = embedding.weight
        self.slot = slot

    def as_linear(self, x: mx.array) -> mx.array:
        choice = self.slot.plan.for_rows(x.size // x.shape[-1])
        return super().as_linear(x) if choice is None else planned_product(x, self.weight, choice)
