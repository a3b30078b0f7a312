"""A forward pass run a few layers at a time on a real fixture model: it pauses between layers, computes exactly what
the whole pass computes, and an abandoned pass leaves the cache as it was before the piece."""

import mlx.core as mx
import pytest

from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.cache.layer_cache import PromptCache, held_token_count, new_prompt_cache
from exo.worker.engines.mlx.generator.layer_steps import SteppedPass, install_layer_steps
from exo.worker.engines.mlx.generator.prefill import PiecePacer, PromptPrefill
from exo.worker.engines.mlx.loaded_model import LoadedModel
from exo.worker.engines.mlx.model_loader import load_model
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR

PROMPT = [(index * 37) % 700 + 10 for index in range(300)]  # within the fixture's 741-token vocabulary


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_model(FIXTURE_MODELS_DIR / "tiny-qwen-tools-deep", ShardAssignment())


def _layer_count(loaded: LoadedModel) -> int:
    return install_layer_steps(loaded.model)


def _whole_pass(loaded: LoadedModel, tokens: list[int]) -> tuple[mx.array, PromptCache]:
    cache = new_prompt_cache(loaded.model)
    logits = loaded.model(mx.array(tokens)[None], cache=cache)
    mx.eval(logits)
    return logits, cache


def test_a_stepped_pass_pauses_at_every_layer_and_computes_what_the_whole_pass_does(loaded: LoadedModel) -> None:
    layers = _layer_count(loaded)
    assert layers > 1
    expected, _ = _whole_pass(loaded, PROMPT)
    cache = new_prompt_cache(loaded.model)
    outputs: list[mx.array] = []

    def forward() -> None:
        logits = loaded.model(mx.array(PROMPT)[None], cache=cache)
        mx.eval(logits)
        outputs.append(logits)

    stepped = SteppedPass(forward)
    held: list[int | None] = []
    while not stepped.advance(0.0):  # a zero slice: it pauses between each two layers
        held.append(held_token_count(cache))
    # A pause between each two layers; paused, the layers disagree: those run hold the piece, the rest not.
    assert held == [None] * (layers - 1)
    assert held_token_count(cache) == len(PROMPT)
    assert stepped.layers_entered == layers
    assert mx.array_equal(outputs[0], expected).item()


def test_an_abandoned_piece_leaves_the_cache_holding_the_finished_pieces(loaded: LoadedModel) -> None:
    pacer = PiecePacer(1e-9)  # every step pauses after one layer
    cache = new_prompt_cache(loaded.model)
    prefill = PromptPrefill(loaded.model, cache, PROMPT, pacer)
    while prefill.step() == 0:  # the first piece
        pass
    first_piece = len(prefill.fed)
    assert prefill.step() == 0  # the second piece started and paused after its first layer
    assert held_token_count(cache) is None
    assert prefill.abandon() is cache
    assert held_token_count(cache) == first_piece

    # Continued from there, the cache computes what a cold pass over the whole prompt does.
    logits = loaded.model(mx.array(PROMPT[first_piece:])[None], cache=cache)
    expected, _ = _whole_pass(loaded, PROMPT)
    assert mx.allclose(logits[0, -1], expected[0, -1], atol=1e-4).item()


def test_layers_outside_a_stepped_pass_run_unchanged(loaded: LoadedModel) -> None:
    _layer_count(loaded)
    before, _ = _whole_pass(loaded, PROMPT[:50])
    install_layer_steps(loaded.model)  # a second install changes nothing
    after, _ = _whole_pass(loaded, PROMPT[:50])
    assert mx.array_equal(before, after).item()
