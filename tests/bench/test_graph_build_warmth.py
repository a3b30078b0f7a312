"""`bench.graph_build_warmth` on a fixture: every condition timed each round, on the model as the runner loads it."""

from bench.graph_build_warmth import CONDITIONS, measure
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR


def test_every_condition_is_timed_each_round() -> None:
    report = measure(FIXTURE_MODELS_DIR / "tiny-qwen-tools", builds=20, rounds=2)
    assert list(report.medians_us) == list(CONDITIONS)
    for medians in report.medians_us.values():
        assert len(medians) == 2
        assert all(median > 0 for median in medians)
    assert report.compiled_layers == 2  # the fixture's two layers, built with their compiled parts
