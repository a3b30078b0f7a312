"""Measure how each of a model's weight shapes is multiplied fastest by a few rows, install the plan in the model's
Linear layers (see `matmul_plan.py` for why), and keep refining the measurements while the runner is idle.

Each shape is timed over the model's own weights, enough of them to exceed the CPU caches as a decode step does,
for every row count up to `MatmulPlanSettings.max_rows` in both layouts, the row counts and layouts taking turns so
that load from elsewhere falls on all of them alike. That takes a second or two after loading, whatever the model's
size (the weights timed per shape are capped). A machine busy with other work at that moment (another model
loading, say) makes those timings noisy and the plan worse; so the runner times each (shape, rows) pair a few more
times while it has nothing to do, one pair at a time (milliseconds each), keeping the best time seen for every
candidate. The plan converges on what the machine does when it is not disturbed.
"""

import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.core as mx
from mlx import nn
from mlx.utils import tree_map_with_path

from exo.shared.types.blas import MatmulPlanReport
from exo.worker.engines.mlx.matmul_plan import (
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
from exo.worker.engines.mlx.utils_mlx import LoadedModel

Shape = tuple[int, int]
Timer = Callable[[Callable[[], None]], float]
"""Runs the given work once and says how many seconds it took."""


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


class MatmulPlanner:
    """The measurements behind a model's matmul plan, and the refinements still to make."""

    def __init__(self, shapes: dict[Shape, _ShapeTimings], settings: MatmulPlanSettings, timer: Timer) -> None:
        self._shapes = shapes
        self._settings = settings
        self._timer = timer
        self._pending: deque[tuple[Shape, int]] = deque(
            (shape, rows)
            for _ in range(settings.refinements)
            for rows in range(1, settings.max_rows + 1)
            for shape in shapes
        )
        self.measured_seconds = 0.0

    @classmethod
    def plan(
        cls, model: nn.Module, settings: MatmulPlanSettings | None = None, timer: Timer = wall_clock
    ) -> "MatmulPlanner | None":
        """Measure and install a plan for every large float32 weight shape of `model`; None when none qualifies."""
        settings = settings or MatmulPlanSettings()
        started = time.perf_counter()
        shapes = _shape_timings(model, settings)
        if not shapes:
            return None
        planner = cls(shapes, settings, timer)
        for _ in range(settings.repeats):
            for rows in range(1, settings.max_rows + 1):
                for timings in shapes.values():
                    planner._time(timings, rows)
        for timings in shapes.values():
            timings.slot.plan = choose_shape_plan(timings.best, settings.max_rows)
        install_plans(model, {shape: timings.slot for shape, timings in shapes.items()})
        planner.measured_seconds = time.perf_counter() - started
        return planner

    @classmethod
    def for_loaded(cls, loaded: LoadedModel) -> "MatmulPlanner | None":
        """The plan exo's runner makes: only float32 weights (what a Linux CPU gets) reach a BLAS's few-row
        kernels; other dtypes are left alone (None)."""
        return cls.plan(loaded.model) if loaded.dtype == "float32" else None

    @property
    def refining(self) -> bool:
        """Whether refinements remain to be made."""
        return bool(self._pending)

    def refine(self) -> None:
        """Time the next (shape, rows) pair in both layouts once more and re-plan that shape (milliseconds)."""
        if not self._pending:
            return
        shape, rows = self._pending.popleft()
        timings = self._shapes[shape]
        self._time(timings, rows)
        timings.slot.plan = choose_shape_plan(timings.best, self._settings.max_rows)

    def report(self) -> MatmulPlanReport:
        """What the plan gains per row count, from the best times measured so far."""
        return MatmulPlanReport(
            measured_seconds=round(self.measured_seconds, 2),
            planned_shapes=len(self._shapes),
            speedup_by_rows={rows: round(self._speedup(rows), 3) for rows in range(1, self._settings.max_rows + 1)},
        )

    def _time(self, timings: _ShapeTimings, rows: int) -> None:
        x = timings.inputs[rows]
        for layout in LAYOUTS:
            choice = RowChoice(layout=layout, computed_rows=rows)

            def one_pass(choice: RowChoice = choice) -> None:
                mx.eval([planned_product(x, weight, choice) for weight in timings.sample])

            elapsed = self._timer(one_pass)
            timings.best[(layout, rows)] = min(timings.best.get((layout, rows), elapsed), elapsed)

    def _speedup(self, rows: int) -> float:
        """mlx's own layout's time over the plan's for `rows` rows, over all planned products.

        Each shape counts once per Linear layer of that shape (once for a tied embedding, the output projection)."""
        own = planned = 0.0
        for timings in self._shapes.values():
            weight = (timings.linear_count or 1) / timings.matrices_per_pass
            choice = timings.slot.plan.choices[rows - 1]
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

    model.update_modules(tree_map_with_path(planned, model.leaf_modules(), is_leaf=nn.Module.is_module))
