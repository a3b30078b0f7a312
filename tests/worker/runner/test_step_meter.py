"""The host-overhead meter's arithmetic: nested parts count exclusively; a step's parts never exceed its wall time; a
helper thread's work is not the loop's."""

import threading
import time

from exo.worker.engines.mlx.step_clock import STEP_CLOCK, StepClock
from exo.worker.runner.step_meter import StepMeter


def test_nested_parts_count_only_for_the_innermost_one() -> None:
    clock = StepClock()
    clock.begin()
    with clock.part("processors"):
        entered = time.perf_counter()
        time.sleep(0.02)
        with clock.part("device"):
            time.sleep(0.05)
        time.sleep(0.02)
        inside = time.perf_counter() - entered
    time.sleep(0.01)
    wall, parts = clock.end()
    assert parts["device"] >= 0.05
    assert parts["processors"] >= 0.04
    # Exclusive: the grammar's own time is its block's time less the device wait inside it (load only adds to both).
    assert parts["processors"] <= inside - parts["device"] + 0.005
    assert parts["processors"] + parts["device"] <= wall
    assert wall >= 0.1


def test_steps_are_summed_by_streams_and_the_loop_gets_the_rest() -> None:
    meter = StepMeter()
    meter.begin()
    time.sleep(0.01)
    meter.end(0)  # nothing decoded: not a decode step
    assert meter.totals == {}
    for _ in range(2):
        meter.begin()
        time.sleep(0.01)
        meter.end(3)
    times = meter.totals[3]
    assert times.steps == 2
    assert abs(times.host_total_seconds + times.device_seconds + times.prefill_seconds - times.step_seconds) < 1e-6
    assert times.host_seconds["loop"] >= 0.02


def test_another_threads_parts_are_not_the_steps_and_its_work_is_counted_beside() -> None:
    clock = StepClock()
    clock.begin()

    def helper() -> None:
        started = time.perf_counter()
        with clock.part("parse"):  # not the loop's: ignored, however long
            time.sleep(0.03)
        clock.add_beside(time.perf_counter() - started)

    with clock.part("launch"):
        thread = threading.Thread(target=helper)
        thread.start()
        thread.join()
    wall, parts = clock.end()
    assert "parse" not in parts
    assert parts["launch"] >= 0.03  # the loop's thread was in its own part all along
    assert parts["beside"] >= 0.03
    assert parts["launch"] <= wall


def test_work_beside_the_loop_is_summed_apart_from_the_host() -> None:
    meter = StepMeter()
    meter.begin()
    STEP_CLOCK.add_beside(0.004)
    with STEP_CLOCK.part("graph"):
        time.sleep(0.01)
    meter.end(1)
    times = meter.totals[1]
    assert times.beside_seconds == 0.004
    assert "beside" not in times.host_seconds
    assert abs(times.host_total_seconds + times.device_seconds + times.prefill_seconds - times.step_seconds) < 1e-6
    meter.begin()  # a new step starts with nothing beside
    meter.end(1)
    assert meter.totals[1].beside_seconds == 0.004
