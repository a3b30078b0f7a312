"""Pure state transitions and placement decisions: no I/O, so they are tested without processes."""

from exo.shared.types.common import ModelId, RunnerId
from exo.shared.types.events import Event, NodeJoined, PreparationUpdated, RunnerUpdated, TaskFinished, TaskUpdated
from exo.shared.types.state import State


def apply(state: State, event: Event) -> State:
    """Return the state after `event`."""
    match event:
        case NodeJoined(node=node):
            return state.model_copy(update={"nodes": {**state.nodes, node.node_id: node}})
        case RunnerUpdated(runner=runner):
            return state.model_copy(update={"runners": {**state.runners, runner.runner_id: runner}})
        case TaskUpdated(task=task):
            return state.model_copy(update={"tasks": {**state.tasks, task.task_id: task}})
        case TaskFinished(task_id=task_id):
            return state.model_copy(update={"tasks": {k: v for k, v in state.tasks.items() if k != task_id}})
        case PreparationUpdated(preparation=preparation):
            preparations = {**state.preparations, preparation.model_id: preparation}
            return state.model_copy(update={"preparations": preparations})


def place_task(state: State, model_id: ModelId) -> RunnerId | None:
    """Choose the runner for a task on `model_id`: a live runner of that model with the fewest tasks."""
    candidates = [
        runner
        for runner in state.runners.values()
        if runner.model_id == model_id and runner.status not in ("shutdown",) and runner.shard.is_emitter
    ]
    if not candidates:
        return None
    load = {runner.runner_id: 0 for runner in candidates}
    for task in state.tasks.values():
        if task.runner_id in load:
            load[task.runner_id] += 1
    return min(candidates, key=lambda runner: (runner.status == "failed", load[runner.runner_id])).runner_id
