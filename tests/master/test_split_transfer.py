"""The transfer term of the `auto` rule (master/split_choice.py, master/split_estimates.py): the bytes a candidate
sends per token over the slowest measured link bandwidth between its nodes. A tensor split's all-sums carry
2 × layers × hidden size × 4 bytes a token (a ring moves 2(N - 1)/N of it through each rank), a pipeline's hops the
hidden state; so a link slow in bytes turns a tensor choice into a pipeline, and without a bandwidth figure the
transfer is not counted and the reason says so.

placement_builders.FOOTPRINT: 8 layers, hidden size 2048; over 2 nodes a tensor split sends 2 × 8 × 2048 × 4 =
128 KiB of all-sums and a 256-byte step message a token (131,328 bytes), a pipeline one 8 KiB hidden state and the
step message (8,448 bytes)."""

from exo.master.split_choice import STEP_MESSAGE_BYTES, pipeline_transfer_bytes, tensor_transfer_bytes
from exo.master.split_estimates import pair_bandwidth, split_bandwidth
from exo.shared.types.common import NodeId
from exo.shared.types.links import LinkMeasurement
from exo.shared.types.state import State
from tests.master.placement_builders import nodes_measured, place, place_request
from tests.shared.state_builders import NODE_A, NODE_B


def test_the_bytes_per_token_follow_the_ring_all_sum_and_the_pipeline_hops() -> None:
    # The default 24-layer model, hidden size 896: 168 KiB of all-sums a token.
    all_sums = 2 * 24 * 896 * 4
    assert all_sums == 168 * 1024
    # Over 2 ranks each rank moves 2(N - 1)/N = 1 times the payload; over 4, 1.5 times; plus the step messages.
    assert tensor_transfer_bytes(24, 896, 2) == all_sums + STEP_MESSAGE_BYTES
    assert tensor_transfer_bytes(24, 896, 4) == all_sums * 3 // 2 + 3 * STEP_MESSAGE_BYTES
    # A pipeline of 3 ranks: two hops of the hidden state.
    assert pipeline_transfer_bytes(896, 3) == 2 * (896 * 4 + STEP_MESSAGE_BYTES)


def test_a_fast_link_in_bytes_keeps_the_tensor_split_and_shows_its_transfer() -> None:
    # 10 GB/s memory, 0.1 ms apart, 1 Gbit/s (125 MB/s): 131,328 bytes take 1.05 ms, 8,448 bytes 0.068 ms.
    state = nodes_measured(4, NODE_A, NODE_B, bandwidth_gb_s=10, round_trip_ms=0.1, link_mb_s=125)
    instance = place(state, place_request(2, "auto"))
    assert instance.parallel == "tensor"
    assert instance.parallel_reason == (
        "auto: tensor over 2 nodes est. 202.8 ms/token (compute 200.0 + 17 × 0.100 ms round trip + 128.2 KiB at "
        "125 MB/s = 1.1 ms transfer) against pipeline over 2 nodes est. 360.4 ms/token (compute 360.0 + 3 × 0.100 "
        "ms round trip + 8.2 KiB at 125 MB/s = 0.068 ms transfer)"
    )


def test_a_slow_link_in_bytes_turns_the_tensor_choice_into_a_pipeline() -> None:
    # The same nodes and round trip, 0.5 MB/s between them: the all-sums take 263 ms a token, the hidden state 17.
    state = nodes_measured(4, NODE_A, NODE_B, bandwidth_gb_s=10, round_trip_ms=0.1, link_mb_s=0.5)
    instance = place(state, place_request(2, "auto"))
    assert instance.parallel == "pipeline"
    reason = instance.parallel_reason or ""
    assert reason.startswith("auto: pipeline over 2 nodes est. 377.2 ms/token")
    assert "8.2 KiB at 0.50 MB/s = 16.9 ms transfer" in reason
    assert "tensor over 2 nodes est. 464.4 ms/token" in reason
    assert "128.2 KiB at 0.50 MB/s = 262.7 ms transfer" in reason
    # Without the bandwidth figure the same nodes get the tensor split, as before it was measured.
    unmeasured = place(nodes_measured(4, NODE_A, NODE_B, bandwidth_gb_s=10, round_trip_ms=0.1), place_request(2))
    assert unmeasured.parallel == "tensor"
    assert "transfer of 128.2 KiB not counted: link bandwidth not measured" in (unmeasured.parallel_reason or "")


def with_link(state: State, node: NodeId, peer: NodeId, link_mb_s: float | None) -> State:
    """`state` with `node`'s figure for its link to `peer` replaced."""
    reported = state.nodes[node]
    link = LinkMeasurement(
        round_trip_ms=0.1,
        samples=5,
        measured_at=1.0,
        bandwidth_bytes_per_second=None if link_mb_s is None else link_mb_s * 1e6,
    )
    facts = reported.facts.model_copy(update={"links": {**reported.facts.links, peer: link}})
    return state.model_copy(update={"nodes": {**state.nodes, node: reported.model_copy(update={"facts": facts})}})


def test_a_pair_weighs_the_slower_of_its_two_figures_and_a_split_its_slowest_pair() -> None:
    state = nodes_measured(4, NODE_A, NODE_B, bandwidth_gb_s=10, round_trip_ms=0.1, link_mb_s=100)
    slower = with_link(state, NODE_B, NODE_A, 40)
    assert pair_bandwidth(slower, NODE_A, NODE_B) == 40e6
    assert split_bandwidth(slower, [NODE_A, NODE_B]) == 40e6
    # One node's figure is enough for the pair; none at all leaves the split without one.
    one_side = with_link(state, NODE_B, NODE_A, None)
    assert pair_bandwidth(one_side, NODE_A, NODE_B) == 100e6
    neither = with_link(one_side, NODE_A, NODE_B, None)
    assert pair_bandwidth(neither, NODE_A, NODE_B) is None
    assert split_bandwidth(neither, [NODE_A, NODE_B]) is None
