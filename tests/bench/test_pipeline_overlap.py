"""The overlap measurement runs two real rank processes on a fixture model and reports every configuration, with the
idle BLAS threads sleeping and spinning."""

from bench.pipeline_overlap import CONFIGURATIONS, measure_overlap
from tests.exo_server import fixture_model
from tests.worker.runner.pipelines import DEEP_MODEL


def test_every_configuration_is_measured_in_both_thread_settings() -> None:
    measured = measure_overlap(fixture_model(DEEP_MODEL), steps=2, warmup_steps=1)

    expected = [(rows, micro_batches, sleep) for sleep in (True, False) for rows, micro_batches in CONFIGURATIONS]
    assert [(run.rows, run.micro_batches, run.threads_sleep) for run in measured.runs] == expected
    assert all(run.tokens == run.rows * 2 and run.wall_s > 0 for run in measured.runs)
    assert measured.steps == 2
