"""`bench.snapshot_load` on a fixture: a prompt is prefilled, its snapshot written and loaded, and both costs the
prefix cache's rule weighs are measured."""

from bench.snapshot_load import measure_length
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.model_loader import load_model
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR


def test_a_snapshot_is_loaded_each_time_and_both_costs_are_measured() -> None:
    loaded = load_model(FIXTURE_MODELS_DIR / "tiny-qwen-tools", ShardAssignment())
    row = measure_length(loaded, 300, loads=2)
    assert len(row.load_seconds) == 2
    assert all(seconds > 0 for seconds in row.load_seconds)
    assert row.snapshot_bytes > 0
    assert row.prefill_seconds_per_token > 0
    assert row.load_seconds_per_byte > 0
    assert row.break_even_tokens > 0
    assert row.markdown().startswith("| 300 |")
