"""Placing a model split by its matrices (tensor parallel): every rank runs every layer with 1/N of its heads and
MLP columns, memory per rank from that share, and a head count the nodes asked for do not divide refused naming the
counts. `auto` keeps the pipeline split."""

import pytest

from exo.api.cluster_views import placed_instance_view
from exo.master.pipeline_placement import RUNTIME_OVERHEAD_BYTES, RUNTIME_OVERHEAD_FRACTION, PlacementError
from exo.master.tensor_placement import IndivisibleHeadsError, tensor_rank_need
from exo.models.footprint import read_footprint
from exo.shared.types.common import NodeId
from exo.shared.types.events import InstancePlaced
from exo.shared.types.footprint import Q8_0_BYTES_PER_WEIGHT
from tests.exo_server import fixture_model
from tests.master.placement_builders import FOOTPRINT, nodes_free, place, place_request
from tests.shared.state_builders import NODE_A, NODE_B, NODE_C, fold


def test_a_tensor_split_runs_every_layer_on_every_rank_with_memory_for_its_share() -> None:
    state = nodes_free((NODE_A, 3), (NODE_B, 6))
    instance = place(state, place_request(2, "tensor"))
    assert instance.parallel == "tensor"
    # Rank 0 (it chooses the tokens) on the node with most memory; both run layers 0-8.
    assert [(rank.node_id, rank.start_layer, rank.end_layer) for rank in instance.ranks] == [
        (NODE_B, 0, 8),
        (NODE_A, 0, 8),
    ]
    # 100 M shared + 800 M / 2 in layers, 4 bytes each: 2.0 GB, plus the room to serve.
    share = 4 * (100_000_000 + 400_000_000)
    expected = int(share * (1 + RUNTIME_OVERHEAD_FRACTION)) + RUNTIME_OVERHEAD_BYTES
    assert [rank.planned_bytes for rank in instance.ranks] == [expected, expected]
    assert instance.peers is not None
    assert instance.peers.parallel == "tensor"
    assert instance.peers.layer_counts == (8, 8)
    shards = [instance.shard(rank) for rank in (0, 1)]
    assert [(shard.start_layer, shard.end_layer, shard.is_tensor, shard.is_emitter) for shard in shards] == [
        (0, 8, True, True),
        (0, 8, True, False),
    ]
    view = placed_instance_view(fold((InstancePlaced(instance=instance), NODE_A), start=state), instance)
    assert (view.parallel, view.world_size) == ("tensor", 2)


def test_a_tensor_split_takes_more_nodes_when_a_share_does_not_fit_and_skips_counts_that_do_not_divide() -> None:
    # The whole model needs 3.9 GiB, half of it 2.3 GiB; 3 nodes do not divide 8 heads; a quarter needs 1.5 GiB.
    footprint = FOOTPRINT.model_copy(update={"kv_heads": 8})
    node_ids = (NODE_A, NODE_B, NODE_C, NodeId("d0000000000000000000000000000004"), NodeId("e" + "0" * 30 + "5"))
    state = nodes_free(*[(node_id, 1.8) for node_id in node_ids])
    instance = place(state, place_request(1, "tensor", footprint))
    assert len(instance.ranks) == 4
    assert instance.ranks[0].planned_bytes == tensor_rank_need(footprint, 4, weights="float32")


@pytest.mark.parametrize(
    ("heads", "kv_heads", "mlp_width", "named"),
    [(7, 7, 4096, "attention heads and KV heads"), (8, 1, 4096, "KV heads"), (8, 2, 4095, "MLP width")],
)
def test_counts_the_nodes_asked_for_do_not_divide_are_refused_naming_them(
    heads: int, kv_heads: int, mlp_width: int, named: str
) -> None:
    footprint = FOOTPRINT.model_copy(update={"attention_heads": heads, "kv_heads": kv_heads, "mlp_width": mlp_width})
    state = nodes_free((NODE_A, 8), (NODE_B, 8))
    with pytest.raises(IndivisibleHeadsError) as refused:
        place(state, place_request(2, "tensor", footprint))
    message = str(refused.value)
    assert f"{named} do not divide by 2" in message
    assert f"attention heads {heads}, KV heads {kv_heads}, MLP width {mlp_width}" in message
    # The same model splits by layers.
    instance = place(state, place_request(2, "pipeline", footprint))
    assert instance.parallel == "pipeline"


def test_a_model_without_head_counts_is_not_split_by_tensor() -> None:
    footprint = FOOTPRINT.model_copy(update={"attention_heads": None, "mlp_width": None})
    state = nodes_free((NODE_A, 8), (NODE_B, 8))
    with pytest.raises(IndivisibleHeadsError, match="does not give its attention heads, MLP width"):
        place(state, place_request(2, "tensor", footprint))


def test_a_tensor_split_that_fits_nowhere_is_refused_with_the_memory() -> None:
    state = nodes_free((NODE_A, 1), (NODE_B, 1))
    with pytest.raises(PlacementError, match=rf"{NODE_A} 1\.00 GiB") as refused:
        place(state, place_request(2, "tensor"))
    assert not isinstance(refused.value, IndivisibleHeadsError)


def test_auto_splits_by_layers() -> None:
    state = nodes_free((NODE_A, 4), (NODE_B, 4))
    instance = place(state, place_request(2, "auto"))
    assert instance.parallel == "pipeline"
    assert instance.peers is not None
    assert instance.peers.parallel == "pipeline"
    assert sorted((rank.start_layer, rank.end_layer) for rank in instance.ranks) == [(0, 4), (4, 8)]


def test_the_footprint_reads_the_counts_a_tensor_split_divides_from_the_config() -> None:
    footprint = read_footprint(fixture_model("tiny-qwen-tools-deep"))
    assert (footprint.attention_heads, footprint.kv_heads, footprint.mlp_width) == (4, 2, 128)
    assert footprint.tensor_split_refusal(2) is None
    assert (
        footprint.tensor_split_refusal(4)
        == "KV heads do not divide by 4 (attention heads 4, KV heads 2, MLP width 128)"
    )


def test_an_int8_node_plans_the_split_layers_in_float32_and_the_shared_weights_in_int8() -> None:
    """The int8 conversion replaces plain linear layers only: the sharded ones of a tensor split stay float32."""
    int8_share = FOOTPRINT.tensor_rank_bytes(2, weights="int8")
    assert int8_share == FOOTPRINT.rank_bytes(0, 0, weights="int8") + 4 * 400_000_000
    assert FOOTPRINT.tensor_rank_bytes(2, weights="float32") == 4 * (100_000_000 + 400_000_000)
    assert FOOTPRINT.tensor_rank_bytes(2, weights="stored") == 200_000_000 + 800_000_000


def test_a_q8_0_node_plans_its_share_of_the_split_layers_as_q8_0_blocks() -> None:
    """Under q8_0 a tensor rank holds its slices of the sharded matrices as Q8_0 blocks, as a whole model does."""
    q8_share = FOOTPRINT.tensor_rank_bytes(2, weights="q8_0")
    assert q8_share == int(100_000_000 * Q8_0_BYTES_PER_WEIGHT) + -(-int(800_000_000 * Q8_0_BYTES_PER_WEIGHT) // 2)
    assert q8_share < FOOTPRINT.tensor_rank_bytes(2, weights="float32") / 3
