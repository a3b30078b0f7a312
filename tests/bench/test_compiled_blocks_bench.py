"""`bench.compiled_blocks` on a fixture: both settings measured at each level, their steps metered by part."""

import os

from bench.compiled_blocks import PARTS, measure
from exo.worker.engines.mlx.compiled_blocks import COMPILED_BLOCKS_VARIABLE
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR


def test_both_settings_are_measured_by_part() -> None:
    report = measure(FIXTURE_MODELS_DIR / "tiny-qwen-tools", [1, 2], rounds=1, max_tokens=12)
    assert sorted((level.compiled, level.streams) for level in report.levels) == [
        (False, 1),
        (False, 2),
        (True, 1),
        (True, 2),
    ]
    for level in report.levels:
        assert level.steps > 0
        assert set(level.parts_ms) == {*PARTS, "loop"}
        assert level.parts_ms["graph"] > 0
        assert level.compiled_layers == (2 if level.compiled else 0)  # the fixture's two layers, compiled or not
    assert COMPILED_BLOCKS_VARIABLE not in os.environ  # the setting it chose for the second load is not left behind
