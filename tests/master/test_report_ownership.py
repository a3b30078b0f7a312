"""The master orders a report only when it is about what the reporting node owns."""

from exo.master.main import owned_by
from exo.shared.types.common import TaskId
from exo.shared.types.events import NodeReported, RunnerUpdated, TaskFinished, TaskUpdated
from tests.shared.state_builders import NODE_A, NODE_B, facts, fold, reported, runner, task


def test_a_node_may_report_its_own_facts_runners_and_tasks() -> None:
    mine = runner("mine", NODE_A)
    state = fold((reported(NODE_A, mine, tasks=(task("t", mine),)), NODE_A))
    assert owned_by(reported(NODE_A, mine, tasks=(task("t", mine),)), NODE_A, state)
    assert owned_by(RunnerUpdated(runner=mine), NODE_A, state)
    assert owned_by(TaskUpdated(task=task("t", mine)), NODE_A, state)
    assert owned_by(TaskFinished(task_id=TaskId("t")), NODE_A, state)
    assert owned_by(TaskFinished(task_id=TaskId("unknown")), NODE_A, state)


def test_a_node_may_not_speak_for_another() -> None:
    theirs = runner("theirs", NODE_B)
    state = fold((reported(NODE_B, theirs, tasks=(task("t", theirs),)), NODE_B))
    assert not owned_by(reported(NODE_B), NODE_A, state)
    assert not owned_by(NodeReported(facts=facts(NODE_A), runners=(theirs,)), NODE_A, state)
    assert not owned_by(NodeReported(facts=facts(NODE_A), tasks=(task("t", theirs),)), NODE_A, state)
    assert not owned_by(RunnerUpdated(runner=theirs), NODE_A, state)
    assert not owned_by(TaskUpdated(task=task("t", theirs)), NODE_A, state)
    assert not owned_by(TaskFinished(task_id=TaskId("t")), NODE_A, state)
