"""Pinned greedy output per weights format for the fixture models on prompts they were not trained on
(greedy_references.py makes the prompts and writes greedy_references.json).

Each format must reproduce its pinned output exactly, and int8 and q8_0 must give float32's output wherever they did
when the references were written: on 21 of the 22 prompts (4 per fixture model, 2 for the Claude Code, MCP and Codex
ones; 24 tokens each), int8 and float32 agree token for token, and so do q8_0 and float32. A prompt where a format
parts from float32 is listed in DIFFERENT with why, so a change in any path shows as a failure here. q8_0 needs
ggml's CPU library (a machine skip without it, for that format only).
"""

import json
from typing import cast

import pytest

from exo.worker.engines.mlx.cpu.blas import find_pypi_mkl
from exo.worker.engines.mlx.cpu.ggml_locate import find_ggml_library, ggml_missing_reason
from tests.fixtures.fixture_specs import FixtureModelName
from tests.machine_skips import skip_for_machine
from tests.worker.engines.mlx.cpu.greedy_references import (
    FORMATS,
    REFERENCES,
    TABLES,
    WeightsFormat,
    greedy_outputs,
)

pytestmark = [
    pytest.mark.slow,  # three loads and 12 greedy runs per model: about a minute and a half for the first four
    pytest.mark.skipif(find_pypi_mkl() is None, reason="the mkl wheel exists only for Linux x86_64"),
]

PINNED = cast(dict[str, dict[str, dict[str, str]]], json.loads(REFERENCES.read_text()))
# (model, format, case) where a quantized format's greedy output differs from float32's on these prompts. The MCP
# fixture, pinned when it joined the table (its trained prompts answer unchanged in every format): asked its first
# turn again in other words, float32 writes `{"name": {}}` where int8 and q8_0 write `{}}`: its first token there is
# `{"` by 0.24 logits over ` {}}\n` in float32, and both roundings tip it the other way (by 0.42 and 0.64).
DIFFERENT: frozenset[tuple[str, str, str]] = frozenset(
    ("tiny-qwen-mcp", weights, "opencode_mcp_first_turn") for weights in ("int8", "q8_0")
)


def test_the_references_cover_every_fixture_model_in_every_format() -> None:
    assert set(PINNED) == set(TABLES)
    for name, outputs in PINNED.items():
        assert set(outputs) == set(FORMATS)
        float32 = outputs["float32"]
        for weights in FORMATS:
            assert outputs[weights].keys() == float32.keys()
            different = {(name, weights, case) for case in float32 if outputs[weights][case] != float32[case]}
            assert different == {entry for entry in DIFFERENT if entry[:2] == (name, weights)}


@pytest.mark.parametrize("weights", FORMATS)
@pytest.mark.parametrize("name", list(TABLES))
def test_each_format_reproduces_its_pinned_greedy_output(name: FixtureModelName, weights: WeightsFormat) -> None:
    if weights == "q8_0" and find_ggml_library() is None:
        skip_for_machine(ggml_missing_reason())
    assert greedy_outputs(name, weights) == PINNED[name][weights]
