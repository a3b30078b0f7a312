"""The runner refines its matmul plan only while no message waits, a step at a time, until nothing is left."""

from collections.abc import Callable
from multiprocessing import Pipe
from pathlib import Path

import pytest

from exo.shared.types.blas import MatmulPlanReport
from exo.shared.types.common import ModelId, new_runner_id
from exo.shared.types.worker.runner_response import (
    MatmulPlanRefined,
    ModelMetadata,
    RunnerRequestAdapter,
    RunnerResponseAdapter,
    Shutdown,
)
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.cpu.matmul_planner import MatmulPlanner, MatmulPlanSettings
from exo.worker.engines.mlx.utils_mlx import load_model
from exo.worker.runner import runner
from exo.worker.runner.channel import RunnerChannel
from exo.worker.runner.supervisor import RunnerConfig, RunnerSupervisor
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
    ours, supervisor = Pipe()

    runner._refine_while_idle(RunnerChannel(ours), planner)  # pyright: ignore[reportPrivateUsage]

    assert not planner.refining
    shapes = planner.report().planned_shapes
    assert timer.calls == 2 * shapes * SETTINGS.max_rows * SETTINGS.refinements
    # The supervisor is told the refined plan once, for /state.
    assert RunnerResponseAdapter.validate_json(supervisor.recv_bytes()) == MatmulPlanRefined(report=planner.report())
    assert not supervisor.poll()


def test_a_waiting_message_stops_refinement_before_it_starts(
    planner_and_timer: tuple[MatmulPlanner, CountingTimer],
) -> None:
    planner, timer = planner_and_timer
    ours, supervisor = Pipe()
    supervisor.send_bytes(RunnerRequestAdapter.dump_json(Shutdown()))  # any message will do

    runner._refine_while_idle(RunnerChannel(ours), planner)  # pyright: ignore[reportPrivateUsage]

    assert planner.refining
    assert timer.calls == 0


def test_the_supervisor_shows_the_refined_plan_in_its_metadata() -> None:
    config = RunnerConfig(model_id=ModelId("tiny-qwen-tools"), model_path=Path("unused"))
    changes: list[None] = []
    supervisor = RunnerSupervisor(new_runner_id(), config, on_change=lambda: changes.append(None))
    first = MatmulPlanReport(measured_seconds=2.0, planned_shapes=5, speedup_by_rows={1: 1.2, 2: 1.1})
    supervisor.metadata = ModelMetadata(
        context_length=4096, tool_format=None, supports_reasoning=False, dtype="float32", matmul_plan=first
    )
    refined = first.model_copy(update={"speedup_by_rows": {1: 1.3, 2: 1.0}, "pass_speedup_by_rows": {1: 1.25, 2: 0.97}})

    supervisor._handle(MatmulPlanRefined(report=refined))  # pyright: ignore[reportPrivateUsage]

    assert supervisor.metadata.matmul_plan == refined
    assert supervisor.metadata.dtype == "float32"
    assert changes  # /state is published again
