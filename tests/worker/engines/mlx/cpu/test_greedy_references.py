"""Pinned greedy output per weights format for the fixture models on prompts they were not trained on
(greedy_references.py makes the prompts and writes greedy_references.json).

Each format must reproduce its pinned output exactly, and int8 must give float32's output wherever it did when the
references were written: on all 16 prompts (4 per fixture model, 24 tokens each), int8 and float32 agree token for
token. A prompt where they part is listed in DIFFERENT with why, so a change in either path shows as a failure here.
"""

import json
from typing import cast

import pytest

from exo.worker.engines.mlx.cpu.blas import find_pypi_mkl
from tests.fixtures.fixture_specs import FixtureModelName
from tests.worker.engines.mlx.cpu.greedy_references import FORMATS, REFERENCES, TABLES, greedy_outputs

pytestmark = [
    pytest.mark.slow,  # two loads and 32 greedy runs per model: about a minute for the four
    pytest.mark.skipif(find_pypi_mkl() is None, reason="the mkl wheel exists only for Linux x86_64"),
]

PINNED = cast(dict[str, dict[str, dict[str, str]]], json.loads(REFERENCES.read_text()))
# (model, case) where int8's greedy output differs from float32's on these prompts; none when pinned.
DIFFERENT: frozenset[tuple[str, str]] = frozenset()


def test_the_references_cover_every_fixture_model_in_both_formats() -> None:
    assert set(PINNED) == set(TABLES)
    for name, outputs in PINNED.items():
        assert set(outputs) == set(FORMATS)
        assert outputs["float32"].keys() == outputs["int8"].keys()
        different = {(name, case) for case in outputs["float32"] if outputs["float32"][case] != outputs["int8"][case]}
        assert different == {pair for pair in DIFFERENT if pair[0] == name}


@pytest.mark.parametrize("name", list(TABLES))
def test_each_format_reproduces_its_pinned_greedy_output(name: FixtureModelName) -> None:
    for weights in FORMATS:
        assert greedy_outputs(name, weights) == PINNED[name][weights], weights
