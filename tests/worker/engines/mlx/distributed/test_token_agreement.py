"""Every rank feeds rank 0's token, whatever it would have chosen itself.

Rank 0 samples (temperature 1.5); the other ranks draw their own tokens at random, as ranks with their own samplers,
grammar states or penalties would. Were each rank to feed its own choice, rank 1 (which runs the first layers and the
embedding) would feed other tokens than rank 0 reports, and rank 0's logits would no longer be the model's logits for
rank 0's tokens. Both are checked against one whole-model process fed rank 0's tokens.
"""

from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR
from tests.worker.engines.mlx.distributed.ranks import run_on_ranks
from tests.worker.engines.mlx.distributed.stages import fed_alone, own_choices_differ


def test_every_rank_feeds_rank_zeros_choice_even_when_its_own_differs() -> None:
    model_dir = FIXTURE_MODELS_DIR / "tiny-qwen-tools-deep"
    ranks = run_on_ranks(own_choices_differ, model_dir, (2, 1, 1))
    leader = ranks[0]
    assert isinstance(leader, dict)
    chosen = leader["own"]
    assert isinstance(chosen, list)
    for rank, result in enumerate(ranks):
        assert isinstance(result, dict)
        assert result["fed"] == chosen, f"rank {rank} fed its own tokens"
        if rank:
            assert result["own"] != chosen, "the other ranks' own choices must differ for this test to mean anything"
    assert leader["logits"] == fed_alone(model_dir, chosen)
