"""Pipeline shard assignments: rank 0 runs the last layers, every rank at least one, and nothing inconsistent passes."""

import pytest
from pydantic import ValidationError

from exo.shared.types.worker.shards import PipelinePeers, ShardAssignment, pipeline_shards


def _peers(layer_counts: tuple[int, ...]) -> PipelinePeers:
    return PipelinePeers(
        ring_addresses=tuple(f"10.0.0.{rank + 1}:5000" for rank in range(len(layer_counts))),
        task_address="10.0.0.1:5001",
        layer_counts=layer_counts,
    )


def test_rank_zero_runs_the_last_layers_and_the_ranges_cover_the_model_once() -> None:
    shards = pipeline_shards(_peers((3, 2, 5)))
    assert [(shard.rank, shard.start_layer, shard.end_layer) for shard in shards] == [(0, 7, 10), (1, 5, 7), (2, 0, 5)]
    assert [shard.is_emitter for shard in shards] == [True, False, False]
    assert all(shard.world_size == 3 for shard in shards)


@pytest.mark.parametrize(
    ("layer_counts", "message"),
    [((4,), "at least 2 ranks"), ((2, 0), "at least one layer")],
)
def test_a_pipeline_needs_two_ranks_with_a_layer_each(layer_counts: tuple[int, ...], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        _peers(layer_counts)


def test_addresses_and_layer_counts_must_pair_up() -> None:
    with pytest.raises(ValidationError, match="one ring address and one layer count per rank"):
        PipelinePeers(ring_addresses=("10.0.0.1:5000",), task_address="10.0.0.1:5001", layer_counts=(1, 1))


def test_a_shard_must_be_its_ranks_share_of_its_pipeline() -> None:
    peers = _peers((2, 2))
    with pytest.raises(ValidationError, match="not rank 1's share"):
        ShardAssignment(rank=1, world_size=2, start_layer=2, end_layer=4, peers=peers)
    with pytest.raises(ValidationError, match="needs its peers"):
        ShardAssignment(rank=1, world_size=2, start_layer=0, end_layer=2)
    with pytest.raises(ValidationError, match="2 layer counts for world size 3"):
        ShardAssignment(rank=1, world_size=3, start_layer=0, end_layer=2, peers=peers)
    with pytest.raises(ValidationError, match="needs none"):
        ShardAssignment(peers=peers)
