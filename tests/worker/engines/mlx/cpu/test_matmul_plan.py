"""The few-row matmul plan: which layout and padding it picks from measured times, that planned products equal mlx's
own, and that a measured plan installs itself in every plain float32 Linear layer of a real model."""

from collections.abc import Callable
from dataclasses import replace

import mlx.core as mx
import pytest
from mlx import nn

from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.cache.layer_cache import PromptCache, held_token_count, new_prompt_cache
from exo.worker.engines.mlx.cpu import forward_pass_probe
from exo.worker.engines.mlx.cpu.forward_pass_probe import ForwardPassProbe
from exo.worker.engines.mlx.cpu.matmul_plan import (
    DEVIATION_MARGIN,
    Layout,
    PlannedEmbedding,
    PlannedLinear,
    PlanSlot,
    RowChoice,
    ShapePlan,
    choose_shape_plan,
    planned_product,
)
from exo.worker.engines.mlx.cpu.matmul_planner import MatmulPlanner, MatmulPlanSettings
from exo.worker.engines.mlx.model_loader import load_model
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR

ROWS_FIRST: Layout = "rows_first"
WEIGHTS_FIRST: Layout = "weights_first"


def _seconds(rows_first: list[float], weights_first: list[float]) -> dict[tuple[Layout, int], float]:
    seconds: dict[tuple[Layout, int], float] = {}
    for rows, (own, other) in enumerate(zip(rows_first, weights_first, strict=True), start=1):
        seconds[(ROWS_FIRST, rows)] = own
        seconds[(WEIGHTS_FIRST, rows)] = other
    return seconds


def test_the_plan_takes_the_layout_that_measured_faster_and_pads_where_more_rows_cost_less() -> None:
    # Shaped like MKL on an AMD CPU: one row slower than two, x @ Wᵀ repacking from three rows on.
    plan = choose_shape_plan(_seconds([10.0, 9.0, 20.0, 21.0], [10.0, 7.0, 9.5, 12.0]), max_rows=4)

    assert plan.choices == (
        RowChoice(layout=WEIGHTS_FIRST, computed_rows=2),
        RowChoice(layout=WEIGHTS_FIRST, computed_rows=2),
        RowChoice(layout=WEIGHTS_FIRST, computed_rows=3),
        RowChoice(layout=WEIGHTS_FIRST, computed_rows=4),
    )
    assert plan.for_rows(1) == RowChoice(layout=WEIGHTS_FIRST, computed_rows=2)
    assert plan.for_rows(5) is None  # beyond the plan: mlx's own product


def test_mlx_s_own_product_stays_unless_another_is_faster_by_more_than_the_margin() -> None:
    just_inside = 1 - DEVIATION_MARGIN / 2
    plan = choose_shape_plan(_seconds([10.0, 10.0], [10.0 * just_inside, 10.0 * just_inside]), max_rows=2)

    assert plan.choices == (
        RowChoice(layout=ROWS_FIRST, computed_rows=1),
        RowChoice(layout=ROWS_FIRST, computed_rows=2),
    )
    assert plan.for_rows(1) is None
    assert plan.for_rows(2) is None


def test_padding_and_a_layout_change_together_must_beat_both_margins() -> None:
    # Two rows in the other layout are 8% cheaper than one row: less than the two deviations' 10%.
    plan = choose_shape_plan(_seconds([10.0, 12.0], [10.0, 9.2]), max_rows=2)

    assert plan.for_rows(1) is None
    assert plan.for_rows(2) == RowChoice(layout=WEIGHTS_FIRST, computed_rows=2)


@pytest.mark.parametrize("layout", [ROWS_FIRST, WEIGHTS_FIRST])
@pytest.mark.parametrize(("leading", "computed_rows"), [((1, 1), 1), ((1, 1), 3), ((2, 3), 6), ((3, 1), 5)])
def test_a_planned_product_equals_mlx_s_over_any_leading_shape(
    layout: Layout, leading: tuple[int, int], computed_rows: int
) -> None:
    weight = mx.random.normal((48, 32), key=mx.random.key(0))
    x = mx.random.normal((*leading, 32), key=mx.random.key(1))

    planned = planned_product(x, weight, RowChoice(layout=layout, computed_rows=computed_rows))

    assert planned.shape == (*leading, 48)
    assert mx.allclose(planned, x @ weight.T, rtol=1e-5, atol=1e-5).item()


def _everywhere(rows: int, layout: Layout, extra_rows: int) -> PlanSlot:
    return PlanSlot(
        ShapePlan(
            choices=tuple(RowChoice(layout=layout, computed_rows=count + extra_rows) for count in range(1, rows + 1))
        )
    )


@pytest.mark.parametrize("bias", [True, False])
def test_a_planned_linear_layer_gives_the_linear_layer_s_results(bias: bool) -> None:
    linear = nn.Linear(32, 48, bias=bias)
    planned = PlannedLinear(linear, _everywhere(4, WEIGHTS_FIRST, extra_rows=1))

    for rows in (1, 3, 4, 9):  # 9: beyond the plan, mlx's own product
        x = mx.random.normal((1, rows, 32), key=mx.random.key(rows))
        assert mx.allclose(planned(x), linear(x), rtol=1e-5, atol=1e-5).item()
    assert ("bias" in planned) == bias
    assert planned.trainable_parameters().keys() == linear.trainable_parameters().keys()


def test_a_planned_embedding_looks_up_as_before_and_projects_as_planned() -> None:
    embedding = nn.Embedding(100, 32)
    planned = PlannedEmbedding(embedding, _everywhere(4, WEIGHTS_FIRST, extra_rows=2))
    tokens = mx.array([[3, 17, 99]])
    hidden = mx.random.normal((1, 2, 32), key=mx.random.key(5))

    assert mx.array_equal(planned(tokens), embedding(tokens)).item()
    assert mx.allclose(planned.as_linear(hidden), embedding.as_linear(hidden), rtol=1e-5, atol=1e-5).item()


# The fixture's matrices are tiny: plan every one of them, from small samples.
# No measuring budget to speak of: these tests count every refinement (tests/worker/runner/test_idle_refinement.py
# checks the budget).
EVERY_SHAPE = MatmulPlanSettings(
    max_rows=4, sample_bytes=1 << 16, smallest_planned_bytes=0, repeats=1, refinements=2, idle_budget_seconds=1e9
)


def test_a_measured_plan_installs_in_every_linear_layer_of_a_real_model_and_keeps_its_answer() -> None:
    loaded = load_model(FIXTURE_MODELS_DIR / "tiny-qwen-tools", ShardAssignment())
    prompt = mx.array([loaded.tokenizer.encode("What is the weather in Paris?")])
    before = loaded.model(prompt)
    linear_count = sum(type(module) is nn.Linear for _, module in loaded.model.named_modules())
    shapes = {
        tuple(module.weight.shape)
        for _, module in loaded.model.named_modules()
        if type(module) in (nn.Linear, nn.Embedding)
    }

    planner = MatmulPlanner.plan(loaded.model, EVERY_SHAPE)

    assert planner is not None
    report = planner.report()
    assert report.planned_shapes == len(shapes)
    assert list(report.speedup_by_rows) == [1, 2, 3, 4]
    assert all(speedup > 0 for speedup in report.speedup_by_rows.values())
    modules = [module for _, module in loaded.model.named_modules()]
    assert sum(isinstance(module, PlannedLinear) for module in modules) == linear_count
    assert not any(type(module) is nn.Linear for module in modules)
    after = loaded.model(prompt)
    assert mx.allclose(after, before, rtol=1e-4, atol=1e-4).item()
    assert mx.array_equal(mx.argmax(after, axis=-1), mx.argmax(before, axis=-1)).item()


class ScriptedTimer:
    """Runs the timed work and reports scripted seconds: each (shape, rows) times rows_first, then weights_first."""

    def __init__(self) -> None:
        self.weights_first_seconds = 2.0
        self.calls = 0

    def __call__(self, work: Callable[[], None]) -> float:
        work()
        self.calls += 1
        return 1.0 if self.calls % 2 == 1 else self.weights_first_seconds


def _layer_plans(model: nn.Module) -> list[ShapePlan]:
    return [module.slot.plan for _, module in model.named_modules() if isinstance(module, PlannedLinear)]


def test_refinements_made_while_idle_keep_the_best_time_and_re_plan_every_layer_of_the_shape() -> None:
    loaded = load_model(FIXTURE_MODELS_DIR / "tiny-qwen-tools", ShardAssignment())
    timer = ScriptedTimer()
    planner = MatmulPlanner.plan(loaded.model, EVERY_SHAPE, timer)
    assert planner is not None
    # Loading happened on a busy machine: the other layout measured twice as slow, so mlx's own stayed.
    assert all(plan.for_rows(rows) is None for plan in _layer_plans(loaded.model) for rows in range(1, 5))
    shapes = planner.report().planned_shapes

    timer.weights_first_seconds = 0.5  # the machine is quiet now: the other layout is faster
    refinements = 0
    while planner.refining:
        planner.refine()
        refinements += 1

    assert refinements == shapes * EVERY_SHAPE.max_rows * EVERY_SHAPE.refinements
    assert timer.calls == 2 * shapes * EVERY_SHAPE.max_rows * (EVERY_SHAPE.repeats + EVERY_SHAPE.refinements)
    for plan in _layer_plans(loaded.model):
        assert [plan.for_rows(rows) for rows in range(1, 5)] == [
            RowChoice(layout=WEIGHTS_FIRST, computed_rows=rows) for rows in range(1, 5)
        ]
    assert planner.report().speedup_by_rows == dict.fromkeys(range(1, 5), 2.0)
    timer.weights_first_seconds = 3.0  # a disturbed timing later never undoes the best one
    planner.refine()
    assert planner.report().speedup_by_rows == dict.fromkeys(range(1, 5), 2.0)


def test_no_plan_for_a_model_whose_weights_are_all_small() -> None:
    loaded = load_model(FIXTURE_MODELS_DIR / "tiny-qwen-tools", ShardAssignment())

    assert MatmulPlanner.plan(loaded.model) is None
    assert any(type(module) is nn.Linear for _, module in loaded.model.named_modules())


class RecordingProbe(ForwardPassProbe):
    """A real probe that also notes each pass: its rows, and whether the layers held the plan or mlx's own."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model, context_tokens=8)
        self.model = model
        self.passes: list[tuple[int, bool]] = []

    def run(self, rows: int) -> None:
        super().run(rows)
        planned = any(plan.for_rows(rows) is not None for plan in _layer_plans(self.model))
        self.passes.append((rows, planned))


class PassTimer:
    """Shape timings say the other layout is twice as fast at every row count; a whole pass takes what
    `planned_pass_seconds` says for its rows with the plan, and 1 second with mlx's own products."""

    def __init__(self, probe: RecordingProbe, planned_pass_seconds: dict[int, float]) -> None:
        self.probe = probe
        self.planned_pass_seconds = planned_pass_seconds
        self.shape_timings = 0

    def __call__(self, work: Callable[[], None]) -> float:
        passes_before = len(self.probe.passes)
        work()
        if len(self.probe.passes) == passes_before:
            self.shape_timings += 1
            return 1.0 if self.shape_timings % 2 == 1 else 0.5
        rows, planned = self.probe.passes[-1]
        return self.planned_pass_seconds[rows] if planned else 1.0


def test_after_the_refinements_whole_passes_decide_which_row_counts_keep_the_plan() -> None:
    loaded = load_model(FIXTURE_MODELS_DIR / "tiny-qwen-tools", ShardAssignment())
    probe = RecordingProbe(loaded.model)
    # Products alone favour the plan at every row count; whole passes are slower with it over 2 and 4 rows.
    planner = MatmulPlanner.plan(loaded.model, EVERY_SHAPE, PassTimer(probe, {1: 0.8, 2: 1.1, 3: 0.9, 4: 1.0}), probe)
    assert planner is not None
    assert probe.passes == []  # nothing is checked in whole passes at load time

    planner.finish()

    # The refinements came first, then each row count's passes, planned and mlx's own taking turns.
    checks = EVERY_SHAPE.pass_checks
    assert probe.passes == [(rows, planned) for _ in range(checks) for rows in range(1, 5) for planned in (True, False)]
    assert not planner.refining
    for plan in _layer_plans(loaded.model):
        assert [plan.for_rows(rows) for rows in range(1, 5)] == [
            RowChoice(layout=WEIGHTS_FIRST, computed_rows=1),
            None,
            RowChoice(layout=WEIGHTS_FIRST, computed_rows=3),
            None,
        ]
    report = planner.report()
    assert report.pass_speedup_by_rows == {1: 1.25, 2: round(1 / 1.1, 3), 3: round(1 / 0.9, 3), 4: 1.0}
    assert report.speedup_by_rows == {1: 2.0, 2: 1.0, 3: 2.0, 4: 1.0}
    assert "whole passes over 1/2/3/4 rows 1.25/0.91/1.11/1.00x faster with the plan" in report.describe()


def test_a_row_count_the_passes_once_rejected_gets_the_plan_back_when_a_later_pass_measures_faster() -> None:
    loaded = load_model(FIXTURE_MODELS_DIR / "tiny-qwen-tools", ShardAssignment())
    probe = RecordingProbe(loaded.model)
    timer = PassTimer(probe, dict.fromkeys(range(1, 5), 1.2))  # disturbed: the planned passes measure slower
    planner = MatmulPlanner.plan(loaded.model, EVERY_SHAPE, timer, probe)
    assert planner is not None
    while not probe.passes or len(probe.passes) < 8:  # every row count checked once
        planner.refine()
    assert all(plan.for_rows(rows) is None for plan in _layer_plans(loaded.model) for rows in range(1, 5))

    timer.planned_pass_seconds = dict.fromkeys(range(1, 5), 0.9)  # quiet again: best times win
    planner.finish()

    assert all(plan.for_rows(rows) is not None for plan in _layer_plans(loaded.model) for rows in range(1, 5))
    assert planner.report().pass_speedup_by_rows == dict.fromkeys(range(1, 5), round(1 / 0.9, 3))


def test_only_the_row_counts_the_plan_changes_are_checked_in_whole_passes() -> None:
    loaded = load_model(FIXTURE_MODELS_DIR / "tiny-qwen-tools", ShardAssignment())
    timer = ScriptedTimer()
    timer.weights_first_seconds = 2.0  # mlx's own layout wins every shape timing: the plan changes nothing
    planner = MatmulPlanner.plan(loaded.model, EVERY_SHAPE, timer, ForwardPassProbe(loaded.model))
    assert planner is not None
    calls_before = timer.calls

    planner.finish()

    shapes = planner.report().planned_shapes
    assert timer.calls - calls_before == 2 * shapes * EVERY_SHAPE.max_rows * EVERY_SHAPE.refinements
    assert planner.report().pass_speedup_by_rows == {}


def test_a_probed_pass_leaves_the_cache_as_it_found_it(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = load_model(FIXTURE_MODELS_DIR / "tiny-qwen-tools", ShardAssignment())
    made: list[PromptCache] = []  # the probe's cache, seen as it is made

    def recorded(model: nn.Module) -> PromptCache:
        made.append(new_prompt_cache(model))
        return made[-1]

    monkeypatch.setattr(forward_pass_probe, "new_prompt_cache", recorded)
    probe = ForwardPassProbe(loaded.model, context_tokens=8)
    probe.prepare()
    assert held_token_count(made[0]) == 8
    for rows in (1, 4, 9):
        probe.run(rows)

    assert held_token_count(made[0]) == 8
    monkeypatch.undo()  # for_model below makes a cache of its own
    assert ForwardPassProbe.for_model(loaded.model) is not None


def test_the_runner_s_plan_is_checked_in_whole_passes_only_for_a_whole_model() -> None:
    whole = load_model(FIXTURE_MODELS_DIR / "tiny-qwen-tools", ShardAssignment())
    another = load_model(FIXTURE_MODELS_DIR / "tiny-qwen-tools", ShardAssignment())
    stage = replace(another, group=mx.distributed.init())  # a pipeline stage: its passes would wait on its peers
    checked: list[bool] = []
    for loaded in (whole, stage):
        timer = ScriptedTimer()
        timer.weights_first_seconds = 0.5  # the plan changes every row count, so a whole model's is checked
        planner = MatmulPlanner.for_loaded(loaded, EVERY_SHAPE, timer)
        assert planner is not None
        planner.finish()
        checked.append(bool(planner.report().pass_speedup_by_rows))

    assert checked == [True, False]
