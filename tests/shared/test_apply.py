"""The fold every node runs: each event's effect on the state, with no processes or network."""

from exo.shared.apply import apply, node_health
from exo.shared.types.common import ModelId, NodeId, TaskId
from exo.shared.types.events import (
    MasterElected,
    NodeDown,
    NodeReported,
    NodeStale,
    RequestEnded,
    RunnerUpdated,
    TaskFinished,
    TaskUpdated,
)
from exo.shared.types.request_record import RECENT_REQUESTS_PER_NODE, RequestRecord
from exo.shared.types.state import NodeHealth
from tests.shared.state_builders import NODE_A, NODE_B, facts, fold, indexed, reported, runner, task


def test_a_report_adds_the_node_with_its_runners_and_tasks_and_the_index_advances() -> None:
    serving = runner("r1", NODE_A)
    state = fold((reported(NODE_A, serving, tasks=(task("t1", serving),)), NODE_A))
    assert state.last_event_index == 1
    assert state.nodes[NODE_A].facts.name == "node-a"
    assert state.nodes[NODE_A].health == NodeHealth(status="healthy")
    assert state.nodes[NODE_A].last_seen == 1000.0
    assert list(state.runners) == ["r1"]
    assert list(state.tasks) == ["t1"]


def test_a_full_report_replaces_what_the_node_owned_and_leaves_other_nodes_alone() -> None:
    old, other = runner("old", NODE_A), runner("other", NODE_B)
    state = fold(
        (reported(NODE_A, old, tasks=(task("stale-task", old),)), NODE_A),
        (reported(NODE_B, other, tasks=(task("b-task", other),)), NODE_B),
    )
    new = runner("new", NODE_A)
    state = fold((reported(NODE_A, new), NODE_A), start=state)
    assert set(state.runners) == {"new", "other"}
    assert set(state.tasks) == {"b-task"}


def test_a_report_keeps_only_entries_owned_by_the_reporting_node() -> None:
    foreign = runner("foreign", NODE_B)
    state = fold((reported(NODE_A, runner("mine", NODE_A), foreign), NODE_A))
    assert set(state.runners) == {"mine"}


def test_every_event_from_a_node_refreshes_its_last_seen() -> None:
    state = fold((reported(NODE_A), NODE_A), at=10.0)
    state = apply(state, indexed(RunnerUpdated(runner=runner("r1", NODE_A)), 2, origin=NODE_A, at=25.0))
    assert state.nodes[NODE_A].last_seen == 25.0


def test_task_events_add_update_and_remove_tasks() -> None:
    serving = runner("r1", NODE_A)
    state = fold((reported(NODE_A, serving), NODE_A))
    state = fold((TaskUpdated(task=task("t1", serving)), NODE_A), start=state)
    state = fold((TaskUpdated(task=task("t1", serving, status="running")), NODE_A), start=state)
    assert state.tasks[TaskId("t1")].status == "running"
    state = fold((TaskFinished(task_id=TaskId("t1")), NODE_A), start=state)
    assert state.tasks == {}


def test_master_elected_names_the_master() -> None:
    state = fold((MasterElected(node_id=NODE_B), NODE_B))
    assert state.master_node_id == NODE_B


def test_a_node_that_leaves_is_down_with_its_reason_and_its_runners_and_tasks_go() -> None:
    serving = runner("r1", NODE_A)
    state = fold((reported(NODE_A, serving, tasks=(task("t1", serving),)), NODE_A), (reported(NODE_B), NODE_B))
    state = fold((NodeDown(node_id=NODE_A, reason="left the cluster"), NODE_B), start=state)
    assert state.nodes[NODE_A].health == NodeHealth(status="down", reason="left the cluster")
    assert state.runners == {}
    assert state.tasks == {}
    # Its id stays listed (a restarted node comes back as itself); the master's event did not refresh it.
    assert state.nodes[NODE_A].last_seen == 1000.0


def test_reports_still_in_flight_when_a_node_left_do_not_bring_its_runners_back() -> None:
    state = fold((reported(NODE_A), NODE_A), (NodeDown(node_id=NODE_A, reason="gone"), NODE_B))
    late = runner("late", NODE_A)
    state = fold((RunnerUpdated(runner=late), NODE_A), (TaskUpdated(task=task("t", late)), NODE_A), start=state)
    assert state.runners == {}
    assert state.tasks == {}
    assert state.nodes[NODE_A].health.status == "down"


def test_a_restarted_node_comes_back_healthy_under_its_id() -> None:
    state = fold((reported(NODE_A), NODE_A), (NodeDown(node_id=NODE_A, reason="gone"), NODE_B))
    state = fold((reported(NODE_A, runner("again", NODE_A)), NODE_A), start=state)
    assert state.nodes[NODE_A].health.status == "healthy"
    assert set(state.runners) == {"again"}


def test_a_failed_runner_degrades_its_node_until_it_recovers() -> None:
    state = fold((reported(NODE_A, runner("r1", NODE_A)), NODE_A))
    failed = runner("r1", NODE_A, status="failed", last_error="runner process exited with code -9")
    state = fold((RunnerUpdated(runner=failed), NODE_A), start=state)
    assert state.nodes[NODE_A].health == NodeHealth(
        status="degraded", reason="runner for model-x failed: runner process exited with code -9"
    )
    state = fold((RunnerUpdated(runner=runner("r1", NODE_A)), NODE_A), start=state)
    assert state.nodes[NODE_A].health.status == "healthy"


def test_low_memory_degrades_a_node() -> None:
    health = node_health(facts(NODE_A, total_gib=16, available_gib=0.5), [])
    assert health == NodeHealth(status="degraded", reason="low memory: 512 MiB available")
    assert node_health(facts(NODE_A, total_gib=16, available_gib=1), []).status == "healthy"


def test_a_silent_node_is_degraded_until_it_reports_again() -> None:
    state = fold((reported(NODE_A), NODE_A))
    state = fold((NodeStale(node_id=NODE_A, silent_seconds=16.04), NODE_B), start=state)
    assert state.nodes[NODE_A].health == NodeHealth(status="degraded", reason="no report for 16 s")
    state = fold((reported(NODE_A), NODE_A), start=state)
    assert state.nodes[NODE_A].health.status == "healthy"


def test_stale_and_down_events_for_unknown_nodes_change_nothing_but_the_index() -> None:
    state = fold((reported(NODE_A), NODE_A))
    stale, down = NodeStale(node_id=NODE_B, silent_seconds=20), NodeDown(node_id=NODE_B, reason="x")
    after = fold((stale, NODE_A), (down, NODE_A), start=state)
    assert after.nodes == state.nodes
    assert after.last_event_index == state.last_event_index + 2


def test_applying_the_same_events_in_the_same_order_gives_the_same_state() -> None:
    serving = runner("r1", NODE_A)
    steps = (
        (MasterElected(node_id=NODE_A), NODE_A),
        (reported(NODE_A, serving), NODE_A),
        (reported(NODE_B), NODE_B),
        (TaskUpdated(task=task("t1", serving, requested_by=NODE_B)), NODE_A),
        (NodeStale(node_id=NODE_B, silent_seconds=15), NODE_A),
    )
    assert fold(*steps) == fold(*steps)
    assert fold(*steps).model_dump_json() == fold(*steps).model_dump_json()


def _request(ended_at: float, served_by: NodeId = NODE_A) -> RequestRecord:
    return RequestRecord(
        dialect="messages",
        model_id=ModelId("m"),
        served_by=served_by,
        outcome="finished",
        finish_reason="stop",
        prompt_tokens=12,
        completion_tokens=3,
        ended_at=ended_at,
    )


def test_ended_requests_are_listed_under_the_node_that_took_them_newest_last_and_bounded() -> None:
    state = fold((reported(NODE_A), NODE_A), (reported(NODE_B), NODE_B))
    extra = 3
    for number in range(RECENT_REQUESTS_PER_NODE + extra):
        state = fold((RequestEnded(record=_request(float(number), served_by=NODE_A)), NODE_B), start=state)
    kept = state.nodes[NODE_B].recent_requests
    assert [request.ended_at for request in kept] == [float(n) for n in range(extra, RECENT_REQUESTS_PER_NODE + extra)]
    assert {request.served_by for request in kept} == {NODE_A}
    assert state.nodes[NODE_A].recent_requests == ()


def test_a_full_report_replaces_the_nodes_recent_requests_and_a_node_that_left_adds_none() -> None:
    state = fold((reported(NODE_A), NODE_A), (RequestEnded(record=_request(1.0)), NODE_A))
    report = reported(NODE_A).model_copy(update={"recent_requests": (_request(5.0), _request(6.0))})
    state = fold((report, NODE_A), start=state)
    assert [request.ended_at for request in state.nodes[NODE_A].recent_requests] == [5.0, 6.0]
    state = fold(
        (NodeDown(node_id=NODE_A, reason="gone"), NODE_B), (RequestEnded(record=_request(7.0)), NODE_A), start=state
    )
    assert [request.ended_at for request in state.nodes[NODE_A].recent_requests] == [5.0, 6.0]


def test_nodes_sharing_a_name_are_told_apart_by_a_short_id_and_unique_names_stay_as_they_are() -> None:
    vm_a = NodeReported(facts=facts(NODE_A, name="vm"), runners=(), tasks=())
    vm_b = NodeReported(facts=facts(NODE_B, name="vm"), runners=(), tasks=())
    alone = fold((vm_a, NODE_A))
    assert alone.nodes[NODE_A].display_name == "vm"
    both = fold((vm_b, NODE_B), start=alone)
    assert both.nodes[NODE_A].display_name == "vm-a00000"
    assert both.nodes[NODE_B].display_name == "vm-b00000"
    # Down, the other "vm" still counts: a name shown a moment ago does not change under the reader.
    after_down = fold((NodeDown(node_id=NODE_B, reason="left"), NODE_A), start=both)
    assert after_down.nodes[NODE_A].display_name == "vm-a00000"
    renamed = NodeReported(facts=facts(NODE_B, name="studio"), runners=(), tasks=())
    apart = fold((renamed, NODE_B), start=after_down)
    assert (apart.nodes[NODE_A].display_name, apart.nodes[NODE_B].display_name) == ("vm", "studio")
