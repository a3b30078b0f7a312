"""The runner refines its matmul plan only while no message waits, a step at a time, until nothing is left."""

from collections.abc import Callable
from multiprocessing import Pipe

import pytest

from exo.shared.types.worker.runner_response import RunnerRequestAdapter, Shutdown
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.matmul_planner import MatmulPlanner, MatmulPlanSettings
from exo.worker.engines.mlx.utils_mlx import load_model
from exo.worker.runner import runner
from exo.worker.runner.runner import RunnerChannel
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR

SETTINGS = MatmulPlanSettings(max_rows=2, sample_bytes=1 << 14, smallest_planned_bytes=0, repeats=1, refinements=3)


class CountingTimer:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, work: Callable[[], None]) -> float:
        work()
        self.calls += 1
        return 1.0


@pytest.fixture
def planner_and_timer() -> tuple[MatmulPlanner, CountingTimer]:
    loaded = load_model(FIXTURE_MODELS_DIR / "tiny-qwen-tools", ShardAssignment())
    timer = CountingTimer()
    planner = MatmulPlanner.plan(loaded.model, SETTINGS, timer)
    assert planner is not None
    timer.calls = 0
    return planner, timer


def test_an_idle_runner_refines_its_plan_until_nothing_is_left(
    planner_and_timer: tuple[MatmulPlanner, CountingTimer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "IDLE_SECONDS_PER_PLAN_REFINEMENT", 0.001)
    planner, timer = planner_and_timer
    ours, _supervisor = Pipe()

    runner._refine_while_idle(RunnerChannel(ours), planner)  # pyright: ignore[reportPrivateUsage]

    assert not planner.refining
    shapes = planner.report().planned_shapes
    assert timer.calls == 2 * shapes * SETTINGS.max_rows * SETTINGS.refinements


def test_a_waiting_message_stops_refinement_before_it_starts(
    planner_and_timer: tuple[MatmulPlanner, CountingTimer],
) -> None:
    planner, timer = planner_and_timer
    ours, supervisor = Pipe()
    supervisor.send_bytes(RunnerRequestAdapter.dump_json(Shutdown()))  # any message will do

    runner._refine_while_idle(RunnerChannel(ours), planner)  # pyright: ignore[reportPrivateUsage]

    assert planner.refining
    assert timer.calls == 0
