"""Availability first, from the state alone: a model the cluster keeps placed but cannot serve now is a 503 with
the reason (never a 404), and a degraded instance drains to its replacement over the nodes asked for."""

import pytest

from exo.api.completion_flow import served_model
from exo.api.errors import ApiError
from exo.api.model_availability import unavailable_error
from exo.master.placement import failed_replacements, no_runner_refusal, place_task, replaced_instances
from exo.shared.types.common import InstanceId, ModelId
from exo.shared.types.events import InstancePlaced, NodeDown, PlacementPending
from exo.shared.types.footprint import ModelFootprint
from exo.shared.types.instances import PendingPlacement, PlacedInstance, RankPlacement
from exo.shared.types.state import State
from tests.shared.state_builders import NODE_A, NODE_B, fold, reported, runner

MODEL = ModelId("model-x")
FOOTPRINT = ModelFootprint(
    layer_parameters=(1000,) * 4, shared_parameters=1000, layer_file_bytes=(2000,) * 4, shared_file_bytes=2000
)
REASON = "model model-x is to be split over 2 nodes but only 1 are up"


def _pending(reason: str = REASON) -> PlacementPending:
    return PlacementPending(
        pending=PendingPlacement(model_id=MODEL, files_from=NODE_A, min_nodes=2, reason=reason, since=10.0)
    )


def _instance(instance_id: str, *, replaces: str | None = None, degraded: bool = False) -> PlacedInstance:
    return PlacedInstance(
        instance_id=InstanceId(instance_id),
        model_id=MODEL,
        min_nodes=2,
        files_from=NODE_A,
        footprint=FOOTPRINT,
        ranks=(RankPlacement(rank=0, node_id=NODE_A, start_layer=0, end_layer=4, planned_bytes=1),),
        peers=None,
        placed_at=1.0,
        degraded_reason="on 1 of the 2 nodes asked for: only 1 node(s) are up" if degraded else None,
        replaces=InstanceId(replaces) if replaces is not None else None,
    )


def _unplaceable() -> State:
    return fold((reported(NODE_A), NODE_A), (reported(NODE_B), NODE_B), (_pending(), NODE_A))


def test_a_pending_placement_is_in_the_state_until_the_model_is_placed() -> None:
    state = _unplaceable()
    assert state.pending_placements[MODEL].reason == REASON
    state = fold((InstancePlaced(instance=_instance("instance-x")), NODE_A), start=state)
    assert state.pending_placements == {}


def test_a_model_the_cluster_keeps_but_cannot_place_is_a_503_with_retry_after_and_the_reason() -> None:
    state = fold((NodeDown(node_id=NODE_B, reason="gone"), NODE_A), start=_unplaceable())
    error = unavailable_error(state, MODEL)
    assert error is not None
    assert (error.status_code, error.body.error.code, error.body.error.param) == (503, "model_unavailable", "model")
    assert int(error.headers["Retry-After"]) > 0
    assert error.body.error.message == f"model 'model-x' is unavailable: {REASON} (nodes up: 1; asked for: 2)"
    # Every dialect picks its model through served_model: named, or the only model the cluster knows.
    for requested in ("model-x", None):
        with pytest.raises(ApiError) as raised:
            served_model(state, requested)
        assert raised.value.status_code == 503
    assert unavailable_error(state, "other-model") is None
    with pytest.raises(ApiError) as unknown:
        served_model(state, "other-model")
    assert (unknown.value.status_code, unknown.value.body.error.code) == (404, "model_not_found")


def test_a_degraded_instance_takes_no_task_once_its_replacement_serves_and_is_drained() -> None:
    old, new = runner("old", NODE_A), runner("new", NODE_A, status="loading")
    state = fold(
        (InstancePlaced(instance=_instance("instance-old", degraded=True)), NODE_A),
        (InstancePlaced(instance=_instance("instance-new", replaces="instance-old")), NODE_A),
        (reported(NODE_A, old, new), NODE_A),
    )
    # The replacement still loads: the degraded instance serves.
    assert replaced_instances(state) == set()
    chosen = place_task(state, MODEL)
    assert chosen is not None
    assert chosen.runner_id == "old"
    state = fold((reported(NODE_A, old, new.model_copy(update={"status": "ready"})), NODE_A), start=state)
    assert replaced_instances(state) == {"instance-old"}
    chosen = place_task(state, MODEL)
    assert chosen is not None
    assert chosen.runner_id == "new"
    # A removed instance's runner (still listed until its node reports it stopped) never gets a task.
    assert place_task(state, MODEL, removed={InstanceId("instance-new"), InstanceId("instance-old")}) is None


def test_a_replacement_whose_rank_failed_is_given_up_while_the_degraded_instance_serves() -> None:
    old, new = runner("old", NODE_A), runner("new", NODE_A, status="failed", last_error="[ring] Couldn't connect")
    state = fold(
        (InstancePlaced(instance=_instance("instance-old", degraded=True)), NODE_A),
        (InstancePlaced(instance=_instance("instance-new", replaces="instance-old")), NODE_A),
        (reported(NODE_A, old, new), NODE_A),
    )
    assert failed_replacements(state) == {"instance-new": "[ring] Couldn't connect"}
    chosen = place_task(state, MODEL)
    assert chosen is not None
    assert chosen.runner_id == "old"
    # The degraded instance itself failing is not a replacement's failure.
    state = fold((reported(NODE_A, old.model_copy(update={"status": "failed"})), NODE_A), start=state)
    assert failed_replacements(state) == {}


def test_a_model_the_cluster_knows_without_a_runner_now_is_refused_as_unavailable_never_as_not_found() -> None:
    # No instance and no pending placement, every node heard from: nobody has the model.
    heard = fold((reported(NODE_A), NODE_A), (reported(NODE_B), NODE_B))
    assert no_runner_refusal(heard, MODEL, unreported=()) == (
        "model_not_found",
        "model 'model-x' is not served by any node of the cluster",
    )
    # A placement is pending: its reason.
    assert no_runner_refusal(_unplaceable(), MODEL, unreported=()) == ("model_unavailable", REASON)
    # Placed (a replacement, or an instance placed anew) while its runners have not reported yet.
    placed = fold((InstancePlaced(instance=_instance("instance-new")), NODE_A), start=heard)
    assert place_task(placed, MODEL) is None
    assert no_runner_refusal(placed, MODEL, unreported=()) == (
        "model_unavailable",
        "model 'model-x' is placed (instance instance-new); its runners are not up yet",
    )
    # A master just elected (or a node just joined): a node that has not reported in full may serve it.
    assert no_runner_refusal(State(), MODEL, unreported=(NODE_B, NODE_A)) == (
        "model_unavailable",
        f"model 'model-x' is not served by the nodes heard from; waiting for {NODE_A}, {NODE_B}",
    )
