"""Placement decisions: pure functions of the state, so they are tested without processes or a network."""

from exo.shared.apply import is_up
from exo.shared.types.common import ModelId
from exo.shared.types.state import RunnerInfo, State


def served_model_ids(state: State) -> list[ModelId]:
    """Every model a runner in the cluster serves (or tried to: a failed runner still answers with its reason)."""
    return sorted({runner.model_id for runner in state.runners.values() if is_up(state, runner.node_id)})


def place_task(state: State, model_id: ModelId) -> RunnerInfo | None:
    """Choose the runner for a task on `model_id`: a live emitting runner of that model with the fewest tasks.

    A failed runner is chosen only when nothing else serves the model, so the client hears why it cannot run.
    """
    candidates = [
        runner
        for runner in state.runners.values()
        if runner.model_id == model_id
        and runner.status != "shutdown"
        and runner.shard.is_emitter
        and is_up(state, runner.node_id)
    ]
    if not candidates:
        return None
    load = {runner.runner_id: 0 for runner in candidates}
    for task in state.tasks.values():
        if task.runner_id in load:
            load[task.runner_id] += 1
    return min(candidates, key=lambda runner: (runner.status == "failed", load[runner.runner_id], runner.runner_id))
