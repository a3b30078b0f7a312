"""The runner refines its matmul plan only while no message waits, a step at a time, resting between steps, until
nothing is left or its measuring budget is spent."""

import time
from collections.abc import Callable
from dataclasses import replace
from multiprocessing import Pipe
from multiprocessing.connection import Connection
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
from exo.worker.engines.mlx.model_loader import load_model
from exo.worker.runner import runner
from exo.worker.runner.channel import RunnerChannel
from exo.worker.runner.runner_config import RunnerConfig
from exo.worker.runner.supervisor import RunnerSupervisor
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR

SETTINGS = MatmulPlanSettings(
    max_rows=2, sample_bytes=1 << 14, smallest_planned_bytes=0, repeats=1, refinements=3, idle_budget_seconds=1000
)


class CountingTimer:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, work: Callable[[], None]) -> float:
        work()
        self.calls += 1
        return 1.0


def _planner(settings: MatmulPlanSettings, timer: Callable[[Callable[[], None]], float]) -> MatmulPlanner:
    loaded = load_model(FIXTURE_MODELS_DIR / "tiny-qwen-tools", ShardAssignment())
    planner = MatmulPlanner.plan(loaded.model, settings, timer)
    assert planner is not None
    return planner


@pytest.fixture
def planner_and_timer() -> tuple[MatmulPlanner, CountingTimer]:
    timer = CountingTimer()
    planner = _planner(SETTINGS, timer)
    timer.calls = 0
    return planner, timer


def _refine_while_idle(connection: Connection, planner: MatmulPlanner) -> None:
    """The runner's idle refinement over `connection`; returns once what it sent is written to the pipe."""
    channel = RunnerChannel(connection)
    runner._refine_while_idle(channel, planner)  # pyright: ignore[reportPrivateUsage]
    channel.close()


def test_refinement_stops_when_its_measuring_budget_is_spent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "IDLE_SECONDS_PER_PLAN_REFINEMENT", 0.001)
    monkeypatch.setattr(runner, "IDLE_REST_PER_BUSY_SECOND", 0.0)
    timer = CountingTimer()  # every timing "takes" 1 s: a (shape, rows) pair, both layouts, 2 s
    planner = _planner(replace(SETTINGS, idle_budget_seconds=4.0), timer)
    timer.calls = 0
    ours, _supervisor = Pipe()

    _refine_while_idle(ours, planner)

    assert not planner.refining
    assert timer.calls == 4  # two pairs, then the budget was spent
    assert planner.idle_seconds == 4.0
    shapes = planner.report().planned_shapes
    assert planner.refinements_dropped == shapes * SETTINGS.max_rows * SETTINGS.refinements - 2


def test_the_idle_runner_rests_three_times_as_long_as_each_step_took(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "IDLE_SECONDS_PER_PLAN_REFINEMENT", 0.001)
    busy: list[float] = []

    def sleeping_timer(work: Callable[[], None]) -> float:
        started = time.monotonic()
        work()
        time.sleep(0.02)
        busy.append(time.monotonic() - started)
        return busy[-1]

    planner = _planner(SETTINGS, sleeping_timer)
    busy.clear()
    ours, _supervisor = Pipe()
    started = time.monotonic()

    _refine_while_idle(ours, planner)

    assert not planner.refining
    # Busy at most a quarter of the time: each step is followed by three times its length of rest (the last one's
    # rest is not waited for, as nothing follows it).
    last_step = busy[-1] + busy[-2]
    assert time.monotonic() - started >= 4 * sum(busy) - 3 * last_step


def test_an_idle_runner_refines_its_plan_until_nothing_is_left(
    planner_and_timer: tuple[MatmulPlanner, CountingTimer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "IDLE_SECONDS_PER_PLAN_REFINEMENT", 0.001)
    planner, timer = planner_and_timer
    ours, supervisor = Pipe()

    _refine_while_idle(ours, planner)

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

    _refine_while_idle(ours, planner)

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
