"""Placement: which runner takes a task, from the state alone."""

from exo.master.placement import place_task, served_model_ids
from exo.shared.types.common import ModelId
from exo.shared.types.events import NodeDown, TaskUpdated
from tests.shared.state_builders import NODE_A, NODE_B, fold, reported, runner, task

MODEL = ModelId("model-x")


def test_the_runner_with_the_fewest_tasks_wins_wherever_it_is() -> None:
    busy, idle = runner("busy", NODE_A), runner("idle", NODE_B)
    state = fold((reported(NODE_A, busy, tasks=(task("t1", busy),)), NODE_A), (reported(NODE_B, idle), NODE_B))
    chosen = place_task(state, MODEL)
    assert chosen is not None
    assert (chosen.runner_id, chosen.node_id) == ("idle", NODE_B)
    state = fold(
        (TaskUpdated(task=task("t2", idle)), NODE_B), (TaskUpdated(task=task("t3", idle)), NODE_B), start=state
    )
    chosen = place_task(state, MODEL)
    assert chosen is not None
    assert chosen.runner_id == "busy"


def test_a_failed_runner_is_chosen_only_when_nothing_else_serves_the_model() -> None:
    failed, ready = runner("failed", NODE_A, status="failed"), runner("ready", NODE_B)
    state = fold((reported(NODE_A, failed), NODE_A), (reported(NODE_B, ready), NODE_B))
    chosen = place_task(state, MODEL)
    assert chosen is not None
    assert chosen.runner_id == "ready"
    state = fold((NodeDown(node_id=NODE_B, reason="gone"), NODE_A), start=state)
    chosen = place_task(state, MODEL)
    assert chosen is not None
    assert chosen.runner_id == "failed"


def test_runners_that_cannot_take_a_task_are_never_chosen() -> None:
    state = fold(
        (
            reported(
                NODE_A, runner("stopped", NODE_A, status="shutdown"), runner("rank1", NODE_A, rank=1, world_size=2)
            ),
            NODE_A,
        )
    )
    assert place_task(state, MODEL) is None
    assert place_task(state, ModelId("other-model")) is None


def test_models_on_nodes_that_left_are_not_served() -> None:
    state = fold(
        (reported(NODE_A, runner("a", NODE_A, "model-a")), NODE_A),
        (reported(NODE_B, runner("b", NODE_B, "model-b")), NODE_B),
    )
    assert served_model_ids(state) == ["model-a", "model-b"]
    state = fold((NodeDown(node_id=NODE_B, reason="gone"), NODE_A), start=state)
    assert served_model_ids(state) == ["model-a"]
