"""Compute from a timed decode step (master/split_estimates.py): where a runner on a node serves the model whole and
has timed enough decode steps with one request decoding, `auto` takes that step, scaled by the share of the whole
model's bytes a rank would hold, as the rank's compute instead of bytes over memory bandwidth, and the reason says
so. A node that timed no step gets its bytes over memory bandwidth times how many times that estimate the timed
nodes' steps took, so that it does not look cheap beside them; where no node timed a step of the model (too few
steps, another model, a runner holding only a rank) every rank keeps bytes over memory bandwidth.

placement_builders.FOOTPRINT: 8 layers and the shared weights, 100 M parameters each (3.6 GB in float32): at 10 GB/s
a pipeline over 2 nodes reads 360 ms worth a token, a tensor rank 200 ms."""

import pytest

from exo.master.split_estimates import MIN_TIMED_STEPS, step_over_bytes, timed_step_seconds
from exo.shared.types.common import ModelId
from exo.shared.types.state import RunnerInfo, State
from exo.shared.types.worker.runner_response import StepTimes
from tests.master.placement_builders import FOOTPRINT, nodes_measured, place, place_request
from tests.shared.state_builders import NODE_A, NODE_B, runner

MODEL = ModelId("model-x")


def timed(runner_info: RunnerInfo, step_ms: float, steps: int = MIN_TIMED_STEPS) -> RunnerInfo:
    """`runner_info` having decoded `steps` steps alone at `step_ms` each, with 0.5 s of another prompt's prefill fed
    in them (not decode time) and some steps of two requests at once (not counted)."""
    alone = StepTimes(steps=steps, step_seconds=steps * step_ms / 1000 + 0.5, prefill_seconds=0.5)
    together = StepTimes(steps=50, step_seconds=50.0)
    return runner_info.model_copy(update={"step_times": {1: alone, 2: together}})


def measured_with(free_gib: float = 4, **runners: RunnerInfo) -> State:
    """Both nodes at 10 GB/s memory bandwidth, 0.1 ms apart, 800 MB/s between them, with a runner per node named."""
    held = {NODE_A if name == "a" else NODE_B: [info] for name, info in runners.items()}
    return nodes_measured(free_gib, NODE_A, NODE_B, bandwidth_gb_s=10, round_trip_ms=0.1, link_mb_s=800, runners=held)


def test_a_decode_step_timed_on_every_node_is_each_ranks_compute_scaled_by_its_share() -> None:
    state = measured_with(a=timed(runner("ra", NODE_A), 50.0), b=timed(runner("rb", NODE_B), 50.0))
    assert timed_step_seconds(state, NODE_A, MODEL) == 0.05
    reason = place(state, place_request(2)).parallel_reason or ""
    # A pipeline's ranks read the whole model once between them: one whole step (50 ms, not the 360 ms that the
    # bytes over memory bandwidth give). A tensor rank reads the shared weights and half of every layer: 2.0 of 3.6 GB.
    assert "pipeline over 2 nodes est. 50.3 ms/token (compute 50.0 from a timed decode step + 3 × 0.100" in reason
    assert "tensor over 2 nodes est. 29.6 ms/token (compute 27.8 from a timed decode step + 17 × 0.100" in reason
    assert reason.startswith("auto: tensor over 2 nodes")


def test_a_step_timed_on_one_node_scales_the_bytes_over_bandwidth_of_the_other() -> None:
    state = measured_with(a=timed(runner("ra", NODE_A), 50.0))
    assert timed_step_seconds(state, NODE_B, MODEL) is None
    # A's step took 50 ms where its 3.6 GB over 10 GB/s say 360: B's bytes over bandwidth count 0.139 times.
    assert step_over_bytes(state, FOOTPRINT, MODEL) == pytest.approx(50 / 360)
    reason = place(state, place_request(2)).parallel_reason or ""
    scaled = "(1 of 2 ranks from a timed decode step, the rest bytes over memory bandwidth × 0.139 as timed)"
    # Tensor: rank A 27.8 ms timed, rank B 2.0 GB at 10 GB/s = 200 ms, scaled to 27.8 as well.
    assert f"tensor over 2 nodes est. 29.6 ms/token (compute 27.8 {scaled} + 17 × 0.100" in reason
    assert f"pipeline over 2 nodes est. 50.3 ms/token (compute 50.0 {scaled} + 3 × 0.100" in reason


def test_a_node_that_timed_nothing_does_not_make_a_split_look_cheaper_than_the_node_that_did() -> None:
    # A holds the whole model and timed 720 ms a step, twice its bytes over memory bandwidth (kernels and Python
    # beyond reading weights); one node may serve it (min_nodes 1). Unscaled, B's half of the layers would count
    # 160 ms where they take A 320: a pipeline over both would look like 400 + 160 ms against one node's 720.
    state = measured_with(8, a=timed(runner("ra", NODE_A), 720.0))
    reason = place(state, place_request(1)).parallel_reason or ""
    assert "one node est. 720.0 ms/token (compute 720.0 from a timed decode step, no link)" in reason
    scaled = "(1 of 2 ranks from a timed decode step, the rest bytes over memory bandwidth × 2 as timed)"
    assert f"pipeline over 2 nodes est. 720.3 ms/token (compute 720.0 {scaled}" in reason
    # A tensor split halves the layers each rank reads: 400 ms on each rank, timed or scaled alike.
    assert reason.startswith(f"auto: tensor over 2 nodes est. 401.9 ms/token (compute 400.0 {scaled}")


def test_too_few_steps_another_model_or_a_runner_of_one_rank_leave_bytes_over_memory_bandwidth() -> None:
    untimed = [
        timed(runner("ra", NODE_A), 50.0, steps=MIN_TIMED_STEPS - 1),
        timed(runner("ra", NODE_A, "model-y"), 50.0),
        timed(runner("ra", NODE_A, rank=0, world_size=2), 50.0),
    ]
    for runner_info in untimed:
        state = measured_with(a=runner_info)
        assert timed_step_seconds(state, NODE_A, MODEL) is None
        reason = place(state, place_request(2)).parallel_reason or ""
        assert "timed" not in reason
        assert "(compute 200.0 + 17 × 0.100" in reason
        assert "(compute 360.0 + 3 × 0.100" in reason
