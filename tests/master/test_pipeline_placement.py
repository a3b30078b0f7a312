"""Placement by memory: the smallest set of nodes that holds the model, layers in proportion to free memory, at least
one each, and a refusal that names the memory needed and available."""

import pytest

from exo.master.pipeline_placement import (
    NodeCapacity,
    PlacementError,
    plan_pipeline,
    rank_need,
    split_layers_by_memory,
)
from exo.shared.types.common import NodeId
from exo.shared.types.footprint import (
    INT8_OVERHEAD,
    Q8_0_BYTES_PER_WEIGHT,
    ModelFootprint,
    WeightsInMemory,
    held_bytes,
)

GIB = 1024**3
# 24 layers of 100 M parameters, 200 M shared: 0.4 GiB a layer and 0.8 GiB shared in float32.
FOOTPRINT = ModelFootprint(
    layer_parameters=(100_000_000,) * 24,
    shared_parameters=200_000_000,
    layer_file_bytes=(200_000_000,) * 24,
    shared_file_bytes=400_000_000,
)


def _node(name: str, gib: float, *, weights: WeightsInMemory = "float32") -> NodeCapacity:
    return NodeCapacity(node_id=NodeId(name), available_bytes=int(gib * GIB), weights=weights)


def test_a_model_that_fits_on_one_node_goes_on_the_one_with_most_memory() -> None:
    plan = plan_pipeline("m", FOOTPRINT, [_node("small", 8), _node("big", 16)])
    assert (plan.node_ids, plan.layer_counts) == (("big",), (24,))


def test_a_model_too_big_for_any_node_goes_on_the_fewest_nodes_that_hold_it() -> None:
    nodes = [_node("a", 6), _node("b", 6), _node("c", 6), _node("d", 1)]
    plan = plan_pipeline("m", FOOTPRINT, nodes)
    assert plan.node_ids == ("a", "b")
    assert plan.layer_counts == (12, 12)
    assert all(need <= 6 * GIB for need in plan.planned_bytes)


def test_layers_follow_free_memory_and_min_nodes_spreads_a_model_that_would_fit_on_fewer() -> None:
    plan = plan_pipeline("m", FOOTPRINT, [_node("a", 12), _node("b", 6), _node("c", 6)], min_nodes=3)
    assert plan.node_ids == ("a", "b", "c")
    assert plan.layer_counts == (12, 6, 6)
    # Every rank holds the shared weights beside its layers.
    assert plan.planned_bytes[1] == rank_need(FOOTPRINT, 6, 12, weights="float32")


def test_a_node_on_native_weights_needs_the_stored_bytes_only() -> None:
    assert rank_need(FOOTPRINT, 0, 24, weights="stored") < rank_need(FOOTPRINT, 0, 24, weights="float32")
    plan = plan_pipeline("m", FOOTPRINT, [_node("mac", 6, weights="stored")])
    assert plan.layer_counts == (24,)


def test_a_node_on_int8_weights_needs_about_a_byte_a_parameter() -> None:
    """2.6 G parameters: 9.7 GiB in float32, about 2.5 GiB as int8 (a byte each plus 1/32 for scales and norms)."""
    parameters = FOOTPRINT.shared_parameters + sum(FOOTPRINT.layer_parameters)
    assert FOOTPRINT.total_bytes(weights="int8") == int(parameters * (1 + INT8_OVERHEAD))
    assert rank_need(FOOTPRINT, 0, 24, weights="int8") < rank_need(FOOTPRINT, 0, 24, weights="float32") / 3
    with pytest.raises(PlacementError):
        plan_pipeline("m", FOOTPRINT, [_node("cpu", 4)])
    plan = plan_pipeline("m", FOOTPRINT, [_node("cpu", 4, weights="int8")])
    assert plan.layer_counts == (24,)


def test_a_node_on_q8_0_weights_needs_34_bytes_per_32_parameters() -> None:
    """2.6 G parameters: about 2.6 GiB as Q8_0 (a float16 scale and 32 int8 values per 32 weights)."""
    parameters = FOOTPRINT.shared_parameters + sum(FOOTPRINT.layer_parameters)
    assert FOOTPRINT.total_bytes(weights="q8_0") == int(parameters * 34 / 32) == int(parameters * Q8_0_BYTES_PER_WEIGHT)
    assert FOOTPRINT.rank_bytes(0, 12, weights="q8_0") == int(
        (FOOTPRINT.shared_parameters + 12 * 100_000_000) * 34 / 32
    )
    plan = plan_pipeline("m", FOOTPRINT, [_node("cpu", 4, weights="q8_0")])
    assert plan.layer_counts == (24,)
    assert plan.planned_bytes == (rank_need(FOOTPRINT, 0, 24, weights="q8_0"),)
    # Two Q8_0 nodes of 1.8 GiB split it; each plans the shared weights and its own layers at Q8_0 size.
    split = plan_pipeline("m", FOOTPRINT, [_node("a", 1.8, weights="q8_0"), _node("b", 1.8, weights="q8_0")])
    assert split.layer_counts == (12, 12)
    assert split.planned_bytes[0] == rank_need(FOOTPRINT, 12, 24, weights="q8_0")


def test_a_node_on_gguf_weights_plans_the_kept_gguf_tensor_bytes() -> None:
    """Under `--cpu-weights gguf` a rank holds its GGUF tensors' bytes (here 60 MB a layer, 150 MB shared: a
    4-5 bit file); a model without a kept GGUF is planned at its imported files' bytes (it is refused at load)."""
    kept = FOOTPRINT.model_copy(update={"layer_gguf_bytes": (60_000_000,) * 24, "shared_gguf_bytes": 150_000_000})
    assert kept.total_bytes(weights="gguf") == 150_000_000 + 24 * 60_000_000
    assert kept.rank_bytes(12, 24, weights="gguf") == 150_000_000 + 12 * 60_000_000
    assert FOOTPRINT.total_bytes(weights="gguf") == FOOTPRINT.total_bytes(weights="stored")
    # 1.3 GiB nodes: too small for the whole model (1.9 GiB with room to serve), enough for half each.
    split = plan_pipeline("m", kept, [_node("a", 1.3, weights="gguf"), _node("b", 1.3, weights="gguf")])
    assert split.layer_counts == (12, 12)
    assert split.planned_bytes[0] == rank_need(kept, 12, 24, weights="gguf")
    # A tensor rank holds its slices of the blocks, or Q8_0 where a column slice does not fall on a K-quant's blocks:
    # planned at the larger, here Q8_0's 34 bytes per 32 weights.
    assert kept.tensor_rank_bytes(2, weights="gguf") == 150_000_000 + int(24 * 100_000_000 * 34 / 32) // 2
    f16 = kept.model_copy(update={"layer_gguf_bytes": (200_000_000,) * 24})
    assert f16.tensor_rank_bytes(2, weights="gguf") == 150_000_000 + 24 * 200_000_000 // 2


@pytest.mark.parametrize(
    ("available", "expected"),
    [
        ([1, 1], (12, 12)),
        ([3, 1], (18, 6)),
        ([100, 1, 1], (22, 1, 1)),
        ([1000, 1], (23, 1)),
        ([5, 4, 3], (10, 8, 6)),
    ],
)
def test_the_layer_split_is_proportional_with_at_least_one_layer_each(
    available: list[int], expected: tuple[int, ...]
) -> None:
    assert split_layers_by_memory(24, available) == expected


def test_a_model_that_fits_nowhere_is_refused_with_the_memory_needed_and_available() -> None:
    with pytest.raises(PlacementError) as refused:
        plan_pipeline("big-model", FOOTPRINT, [_node("a", 3), _node("b", 2.5)])
    message = str(refused.value)
    assert (
        "big-model does not fit: it needs 10.90 GiB in all with its weights held as float32 (1.07 GiB on each"
        in message
    )
    assert message.endswith("held as int8 (`--cpu-weights int8` on a Linux CPU) it would need 3.00 GiB")
    assert "available: a 3.00 GiB, b 2.50 GiB" in message
    with pytest.raises(PlacementError, match="split over 3 nodes but only 2 are up"):
        plan_pipeline("m", FOOTPRINT, [_node("a", 30), _node("b", 30)], min_nodes=3)
    with pytest.raises(PlacementError, match="has 24 layers: it cannot be split over 25 nodes"):
        plan_pipeline("m", FOOTPRINT, [_node(str(n), 30) for n in range(25)], min_nodes=25)


def _qwen25_7b_footprint() -> ModelFootprint:
    """Qwen2.5-Coder-7B-Instruct's parameters, from its published config (hidden 3584, MLP 18944, 28 layers, 28
    query and 4 key/value heads of 128, vocabulary 152064, untied output matrix), stored in bfloat16."""
    hidden, mlp, kv, vocab = 3584, 18944, 4 * 128, 152064
    attention = hidden * hidden + hidden + 2 * (hidden * kv + kv) + hidden * hidden
    layer = attention + 3 * hidden * mlp + 2 * hidden
    shared = 2 * vocab * hidden + hidden
    return ModelFootprint(
        layer_parameters=(layer,) * 28,
        shared_parameters=shared,
        layer_file_bytes=(2 * layer,) * 28,
        shared_file_bytes=2 * shared,
    )


def test_a_24_gb_cpu_machine_takes_a_7b_model_as_int8_and_refuses_it_as_float32_naming_both_sizes() -> None:
    """7.6 G parameters: about 7.3 GiB of int8 weights (8.3 GiB planned with room to serve) fit a 24 GB machine's free
    memory; float32 needs 31 GiB and is refused, the message naming the need, the memory there and the int8 size."""
    footprint = _qwen25_7b_footprint()
    parameters = footprint.shared_parameters + sum(footprint.layer_parameters)
    assert 7.6e9 < parameters < 7.7e9
    assert footprint.total_bytes(weights="int8") == held_bytes(parameters, 2 * parameters, weights="int8")
    free = 22 * GIB  # what a 24 GB machine has free with its system running
    plan = plan_pipeline("qwen2.5-coder-7b", footprint, [_node("cpu24", free / GIB, weights="int8")])
    assert plan.layer_counts == (28,)
    assert plan.planned_bytes == (rank_need(footprint, 0, 28, weights="int8"),)
    assert 8 * GIB < plan.planned_bytes[0] < 9 * GIB
    with pytest.raises(PlacementError) as refused:
        plan_pipeline("qwen2.5-coder-7b", footprint, [_node("cpu24", free / GIB, weights="float32")])
    float32_need = rank_need(footprint, 0, 28, weights="float32") / GIB
    int8_need = plan.planned_bytes[0] / GIB
    assert str(refused.value) == (
        f"model qwen2.5-coder-7b does not fit: it needs {float32_need:.2f} GiB in all with its weights held as float32 "
        f"({rank_need(footprint, 0, 0, weights='float32') / GIB:.2f} GiB on each node it is split over, plus its 28 "
        f"layers); available: cpu24 22.00 GiB; held as int8 (`--cpu-weights int8` on a Linux CPU) it would need "
        f"{int8_need:.2f} GiB"
    )
    assert float32_need > 30
