"""The idle runner's coalescing window follows its measured lone decode steps, within its bounds."""

import pytest

from exo.worker.runner.arrival_window import (
    FIRST_STEP_SECONDS,
    MAX_SECONDS,
    MAX_TOTAL_SECONDS,
    MIN_SECONDS,
    ArrivalWindow,
)


def test_before_any_step_the_window_is_the_first_guess() -> None:
    assert ArrivalWindow().seconds == FIRST_STEP_SECONDS


def test_the_window_is_about_one_measured_step() -> None:
    window = ArrivalWindow()
    window.record_step(0.02)
    assert window.seconds == pytest.approx(0.02)
    for _ in range(50):
        window.record_step(0.004)
    assert window.seconds == pytest.approx(0.004, rel=0.01)


def test_one_slow_step_moves_the_window_only_part_of_the_way() -> None:
    window = ArrivalWindow()
    window.record_step(0.004)
    window.record_step(0.044)
    assert 0.004 < window.seconds < 0.044


@pytest.mark.parametrize(("step", "expected"), [(1e-6, MIN_SECONDS), (2.0, MAX_SECONDS)])
def test_the_window_stays_within_its_bounds(step: float, expected: float) -> None:
    window = ArrivalWindow()
    window.record_step(step)
    assert window.seconds == expected


def test_each_arrival_opens_the_window_again_up_to_the_total_bound() -> None:
    window = ArrivalWindow()
    window.record_step(0.02)
    assert window.deadline(100.0, 100.0) == pytest.approx(100.02)  # a lone request waits one step
    assert window.deadline(100.0, 100.05) == pytest.approx(100.07)  # one that came on time extends it
    assert window.deadline(100.0, 100.09) == pytest.approx(100.0 + MAX_TOTAL_SECONDS)  # never past the bound
