"""Measure how each of a model's weight shapes is multiplied fastest by a few rows, install the plan in the model's
Linear layers (see `matmul_plan.py` for why), and keep refining the measurements while the runner is idle.

Each shape is timed over the model's own weights, enough of them to exceed the CPU caches as a decode step does,
for every row count up to `MatmulPlanSettings.max_rows` in both layouts, the row counts and layouts taking turns so
that load from elsewhere falls on all of them alike. That takes a second or two after loading, whatever the model's
size (the weights timed per shape are capped). A machine busy with other work at that moment (another model
loading, say) makes those timings noisy and the plan worse; so the runner times each (shape, rows) pair a few more
times while it has nothing to do, one pair at a time (milliseconds each), keeping the best time seen for every
candidate. The plan converges on what the machine does when it is not disturbed. Those idle timings are bounded:
they stop once `MatmulPlanSettings.idle_budget_seconds` of measuring is spent (the plan keeps what was measured),
and the runner rests between steps (runner.py), so a new runner takes a bounded share of the machine's first minutes.

Products timed alone can mislead: inside a forward pass a layout that won alone can lose (see
`forward_pass_probe.py`). Once the refinements are done, the idle runner therefore times whole forward passes over
each planned row count, with the plan and with mlx's own products, taking turns; a row count keeps the plan only
where its passes measured faster with it, and mlx's own products serve it otherwise.
"""

import logging
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import mlx.core as mx
from mlx import nn
from mlx.utils import tree_map_with_path

from exo.shared.types.blas import MatmulPlanReport
from exo.worker.engines.mlx.compiled_blocks import remove_compiled_blocks
from exo.worker.engines.mlx.cpu.forward_pass_probe import ForwardPassProbe
from exo.worker.engines.mlx.cpu.matmul_plan import (
    LAYOUTS,
    Layout,
    PlannedEmbedding,
    PlannedLinear,
    PlanSlot,
    RowChoice,
    ShapePlan,
    choose_shape_plan,
    planned_product,
)
from exo.worker.engines.mlx.loaded_model import LoadedModel

Shape = tuple[int, int]
Timer = Callable[[Callable[[], None]], float]
"""Runs the given work once and says how many seconds it took."""

logger = logging.getLogger(__name__)


def wall_clock(work: Callable[[], None]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


@dataclass(frozen=True)
class MatmulPlanSettings:
    max_rows: int = 10
    """Row counts planned: a batch of 8 sequences, or a draft of 8 tokens plus the token before it, and one more
    for padding to. Products over more rows (prompt processing) keep mlx's own layout."""
    sample_bytes: int = 64 << 20
    """Weights timed per shape: twice a common last-level cache, so the timing streams them from memory."""
    smallest_planned_bytes: int = 8 << 20
    """A shape whose weights hold less in all is left alone: too little of a step to be worth a measurement."""
    repeats: int = 3
    """Timings of every (shape, layout, rows) right after loading."""
    refinements: int = 5
    """Further timings of every (shape, rows) in both layouts while the runner is idle, one pair at a time."""
    pass_checks: int = 5
    """Then timings of a whole forward pass over each row count the plan changes, with the plan and with mlx's own
    products, while the runner is idle, one pass at a time."""
    idle_budget_seconds: float = 20.0
    """The most measured time the idle refinements of single products may take in all; the ones left then are
    dropped and the plan as measured so far goes to its whole-pass check (which always runs: it is what keeps a
    plan that loses inside a pass out). Measured: a 2-core machine spent about 4.5 minutes at up to 200% CPU on
    refinements and checks after a start before this bound."""


@dataclass
class _ShapeTimings:
    """One weight shape: the matrices timed, the layers that follow its plan and the best time of each candidate."""

    slot: PlanSlot
    sample: list[mx.array]
    matrices_per_pass: float
    """How many of the shape's whole matrices one pass over `sample` stands for."""
    linear_count: int
    inputs: dict[int, mx.array]
    best: dict[tuple[Layout, int], float] = field(default_factory=dict[tuple[Layout, int], float])


PassVariant = Literal["planned", "mlx_own"]
"""A forward pass with every shape's planned products, or with mlx's own products throughout."""


class MatmulPlanner:
    """The measurements behind a model's matmul plan, and the refinements still to make."""

    def __init__(
        self,
        shapes: dict[Shape, _ShapeTimings],
        settings: MatmulPlanSettings,
        timer: Timer,
        probe: ForwardPassProbe | None,
    ) -> None:
        self._shapes = shapes
        self._settings = settings
        self._timer = timer
        self._probe = probe
        self._pending: deque[tuple[Shape, int]] = deque(
            (shape, rows)
            for _ in range(settings.refinements)
            for rows in range(1, settings.max_rows + 1)
            for shape in shapes
        )
        self._pending_passes: deque[tuple[int, PassVariant]] | None = None
        """Made when the refinements are done (the plan they settle on is the one checked); None until then."""
        self._pass_best: dict[tuple[int, PassVariant], float] = {}
        self.measured_seconds = 0.0
        self.idle_seconds = 0.0
        """Measured time of the refinements and pass checks made so far (what `idle_budget_seconds` bounds)."""
        self.refinements_dropped = 0
        """Refinements left undone when the budget ran out."""

    @classmethod
    def plan(
        cls,
        model: nn.Module,
        settings: MatmulPlanSettings | None = None,
        timer: Timer = wall_clock,
        probe: ForwardPassProbe | None = None,
    ) -> "MatmulPlanner | None":
        """Measure and install a plan for every large float32 weight shape of `model`; None when none qualifies.

        With a `probe`, the refinements end with whole forward passes that check the plan per row count."""
        settings = settings or MatmulPlanSettings()
        started = time.perf_counter()
        shapes = _shape_timings(model, settings)
        if not shapes:
            return None
        planner = cls(shapes, settings, timer, probe)
        for _ in range(settings.repeats):
            for rows in range(1, settings.max_rows + 1):
                for timings in shapes.values():
                    planner._time(timings, rows)
        for timings in shapes.values():
            timings.slot.plan = planner._plan_of(timings)
        install_plans(model, {shape: timings.slot for shape, timings in shapes.items()})
        planner.measured_seconds = time.perf_counter() - started
        return planner

    @classmethod
    def for_loaded(
        cls, loaded: LoadedModel, settings: MatmulPlanSettings | None = None, timer: Timer = wall_clock
    ) -> "MatmulPlanner | None":
        """The plan exo's runner makes: only float32 weights (what a Linux CPU gets) reach a BLAS's few-row
        kernels; other dtypes are left alone (None). A pipeline stage's forward pass waits on its peers, so only a
        whole model's plan is checked in whole passes."""
        if loaded.dtype != "float32":
            return None
        probe = ForwardPassProbe.for_model(loaded.model) if loaded.group is None else None
        return cls.plan(loaded.model, settings, timer, probe)

    @property
    def refining(self) -> bool:
        """Whether refinements or pass checks remain to be made."""
        return bool(self._pending) or (self._probe is not None and bool(self._passes_to_check()))

    def refine(self) -> None:
        """Time the next (shape, rows) pair in both layouts once more and re-plan that shape (milliseconds); once
        those are done, time the next whole forward pass of the plan's check (a decode step's time)."""
        if self._pending and self.idle_seconds >= self._settings.idle_budget_seconds:
            self.refinements_dropped = len(self._pending)
            self._pending.clear()
        if self._pending:
            shape, rows = self._pending.popleft()
            timings = self._shapes[shape]
            self.idle_seconds += self._time(timings, rows)
            timings.slot.plan = self._plan_of(timings)
            return
        if self._probe is None or not (passes := self._passes_to_check()):
            return
        if not self._probe.prepared:  # a short prefill, in a step of its own so that no timed pass includes it
            self._probe.prepare()
            return
        rows, variant = passes.popleft()
        self.idle_seconds += self._time_pass(self._probe, rows, variant)
        if not passes:
            self._probe.release()

    def finish(self) -> None:
        """Make every refinement and pass check left now, as an idle runner would over its first minute or two."""
        while self.refining:
            self.refine()

    def report(self) -> MatmulPlanReport:
        """What the plan gains per row count, from the best times measured so far."""
        return MatmulPlanReport(
            measured_seconds=round(self.measured_seconds, 2),
            planned_shapes=len(self._shapes),
            speedup_by_rows={rows: round(self._speedup(rows), 3) for rows in range(1, self._settings.max_rows + 1)},
            pass_speedup_by_rows={
                rows: round(own / planned, 3) for rows, (planned, own) in self._checked_passes().items()
            },
        )

    def _checked_passes(self) -> dict[int, tuple[float, float]]:
        """The best planned and mlx-own pass times, by row count, where both were measured."""
        checked: dict[int, tuple[float, float]] = {}
        for rows in range(1, self._settings.max_rows + 1):
            planned, own = self._pass_best.get((rows, "planned")), self._pass_best.get((rows, "mlx_own"))
            if planned is not None and own is not None:
                checked[rows] = (planned, own)
        return checked

    def _own_rows(self) -> set[int]:
        """Row counts whose passes measured no faster with the plan: mlx's own products serve them."""
        return {rows for rows, (planned, own) in self._checked_passes().items() if planned >= own}

    def _plan_of(self, timings: _ShapeTimings) -> ShapePlan:
        """The shape's plan: its measured choices, except mlx's own product where whole passes said so."""
        return _with_own_rows(self._choices_of(timings), self._own_rows())

    def _choices_of(self, timings: _ShapeTimings) -> ShapePlan:
        return choose_shape_plan(timings.best, self._settings.max_rows)

    def _passes_to_check(self) -> deque[tuple[int, PassVariant]]:
        """The passes still to time: every row count some shape's choices change, both variants taking turns."""
        if self._pending_passes is None:
            changed = [
                rows
                for rows in range(1, self._settings.max_rows + 1)
                if any(self._choices_of(timings).for_rows(rows) is not None for timings in self._shapes.values())
            ]
            variants: tuple[PassVariant, ...] = ("planned", "mlx_own")
            self._pending_passes = deque(
                (rows, variant) for _ in range(self._settings.pass_checks) for rows in changed for variant in variants
            )
        return self._pending_passes

    def _time_pass(self, probe: ForwardPassProbe, rows: int, variant: PassVariant) -> float:
        """Time one pass over `rows` tokens in `variant`, then install the plans its verdict so far gives; returns
        the time measured."""
        for timings in self._shapes.values():
            timings.slot.plan = self._choices_of(timings) if variant == "planned" else ShapePlan(choices=())
        elapsed = self._timer(lambda: probe.run(rows))
        self._pass_best[(rows, variant)] = min(self._pass_best.get((rows, variant), elapsed), elapsed)
        for timings in self._shapes.values():
            timings.slot.plan = self._plan_of(timings)
        return elapsed

    def _time(self, timings: _ShapeTimings, rows: int) -> float:
        """Time the shape's product over `rows` rows in both layouts; returns the time measured in all."""
        x = timings.inputs[rows]
        spent = 0.0
        for layout in LAYOUTS:
            choice = RowChoice(layout=layout, computed_rows=rows)

            def one_pass(choice: RowChoice = choice) -> None:
                mx.eval([planned_product(x, weight, choice) for weight in timings.sample])

            elapsed = self._timer(one_pass)
            timings.best[(layout, rows)] = min(timings.best.get((layout, rows), elapsed), elapsed)
            spent += elapsed
        return spent

    def _speedup(self, rows: int) -> float:
        """mlx's own layout's time over the plan's for `rows` rows, over all planned products.

        Each shape counts once per Linear layer of that shape (once for a tied embedding, the output projection)."""
        own = planned = 0.0
        for timings in self._shapes.values():
            weight = (timings.linear_count or 1) / timings.matrices_per_pass
            choice = timings.slot.plan.for_rows(rows) or RowChoice(layout="rows_first", computed_rows=rows)
            own += weight * timings.best[("rows_first", rows)]
            planned += weight * timings.best[(choice.layout, choice.computed_rows)]
        return own / planned


def _shape_timings(model: nn.Module, settings: MatmulPlanSettings) -> dict[Shape, _ShapeTimings]:
    """The float32 matrices of the model's plain Linear and Embedding layers, by shape, for shapes large enough."""
    weights: dict[Shape, list[mx.array]] = defaultdict(list)
    linear_counts: dict[Shape, int] = defaultdict(int)
    for _, module in model.named_modules():
        if type(module) not in (nn.Linear, nn.Embedding):
            continue
        weight: mx.array = module.weight
        if weight.ndim != 2 or weight.dtype != mx.float32:
            continue
        shape = (weight.shape[0], weight.shape[1])
        weights[shape].append(weight)
        linear_counts[shape] += type(module) is nn.Linear
    found: dict[Shape, _ShapeTimings] = {}
    for shape, matrices in weights.items():
        if sum(weight.nbytes for weight in matrices) < settings.smallest_planned_bytes:
            continue
        sample, matrices_per_pass = _sample(matrices, settings.sample_bytes)
        inputs = {
            rows: mx.random.normal((rows, shape[1]), dtype=mx.float32, key=mx.random.key(rows))
            for rows in range(1, settings.max_rows + 1)
        }
        mx.eval(list(inputs.values()))
        placeholder = ShapePlan(choices=())  # replaced once measured
        found[shape] = _ShapeTimings(PlanSlot(placeholder), sample, matrices_per_pass, linear_counts[shape], inputs)
    return found


def _sample(weights: list[mx.array], budget: int) -> tuple[list[mx.array], float]:
    """The matrices to time (about `budget` bytes of them) and how many whole matrices one pass over them is."""
    first = weights[0]
    if first.nbytes >= budget:
        # The leading rows of a row-major matrix: a contiguous part of it, no copy.
        rows = max(1, budget // (first.shape[1] * first.itemsize))
        return [first[:rows]], rows / first.shape[0]
    count = min(len(weights), -(-budget // first.nbytes))
    return weights[:count], float(count)


def _with_own_rows(plan: ShapePlan, own_rows: set[int]) -> ShapePlan:
    """`plan` with mlx's own product for each of `own_rows`."""
    if not own_rows:
        return plan
    choices = tuple(
        RowChoice(layout="rows_first", computed_rows=rows) if rows in own_rows else choice
        for rows, choice in enumerate(plan.choices, start=1)
    )
    return ShapePlan(choices=choices)


def install_plans(model: nn.Module, slots: dict[Shape, PlanSlot]) -> None:
    """Give every plain float32 Linear and Embedding layer whose weight shape has a plan a planned twin in place."""

    def slot_for(weight: mx.array) -> PlanSlot | None:
        return slots.get((weight.shape[0], weight.shape[1])) if weight.ndim == 2 else None

    def planned(_: str, module: nn.Module) -> nn.Module:
        if type(module) is nn.Linear and (slot := slot_for(module.weight)) is not None:
            return PlannedLinear(module, slot)
        if type(module) is nn.Embedding and (slot := slot_for(module.weight)) is not None:
            return PlannedEmbedding(module, slot)
        return module

    # Compiled parts would go on calling the modules they traced, and a planned layer decides its layout per call.
    if removed := remove_compiled_blocks(model):
        logger.info("compiled blocks off for %d decoder layers: the matmul plan's layers choose per call", removed)
    model.update_modules(tree_map_with_path(planned, model.leaf_modules(), is_leaf=nn.Module.is_module))
