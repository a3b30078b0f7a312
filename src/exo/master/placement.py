"""Placement decisions: pure functions of the state, so they are tested without processes or a network."""

from collections.abc import Collection

from exo.shared.apply import is_up
from exo.shared.types.common import InstanceId, ModelId, NodeId
from exo.shared.types.instances import PlacedInstance
from exo.shared.types.preparation import ModelPreparation, PreparationPhase
from exo.shared.types.state import RunnerInfo, State
from exo.shared.types.task_replies import RefusalReason

SERVING: frozenset[str] = frozenset({"ready", "running"})
_PREPARATION_ENDED: frozenset[PreparationPhase] = frozenset({"ready", "failed"})


def served_model_ids(state: State) -> list[ModelId]:
    """Every model a runner in the cluster serves (or tried to: a failed runner still answers with its reason)."""
    return sorted({runner.model_id for runner in state.runners.values() if is_up(state, runner.node_id)})


def models_in_preparation(state: State) -> dict[ModelId, ModelPreparation]:
    """The models a live node is downloading, assembling or converting now, with that node's progress (the furthest
    along where several prepare the same model)."""
    preparing: dict[ModelId, ModelPreparation] = {}
    for node in state.nodes.values():
        if node.health.status == "down":
            continue
        for model_id, preparation in node.preparations.items():
            known = preparing.get(model_id)
            if preparation.phase not in _PREPARATION_ENDED and (known is None or _ahead(preparation, known)):
                preparing[model_id] = preparation
    return preparing


def _ahead(one: ModelPreparation, other: ModelPreparation) -> bool:
    return one.done_bytes * max(other.total_bytes, 1) > other.done_bytes * max(one.total_bytes, 1)


def place_task(state: State, model_id: ModelId, removed: Collection[InstanceId] = frozenset()) -> RunnerInfo | None:
    """Choose the runner for a task on `model_id`: a live emitting runner of that model with the fewest tasks.

    A failed runner is chosen only when nothing else serves the model, so the client hears why it cannot run. A
    runner that is serving beats one still loading, and a degraded instance whose replacement (over the nodes
    asked for) serves gets no new task, so it drains and can be retired without dropping anything. Runners of
    `removed` instances (still listed until their nodes report them stopped) get none.
    """
    candidates = [
        runner
        for runner in state.runners.values()
        if runner.model_id == model_id
        and runner.status != "shutdown"
        and runner.shard.is_emitter
        and is_up(state, runner.node_id)
        and runner.instance_id not in removed
    ]
    if not candidates:
        return None
    load = {runner.runner_id: 0 for runner in candidates}
    for task in state.tasks.values():
        if task.runner_id in load:
            load[task.runner_id] += 1
    retiring = replaced_instances(state)
    return min(
        candidates,
        key=lambda runner: (
            runner.status == "failed",
            runner.instance_id in retiring,
            runner.status not in SERVING,
            load[runner.runner_id],
            runner.runner_id,
        ),
    )


def no_runner_refusal(state: State, model_id: ModelId, unreported: Collection[NodeId]) -> tuple[RefusalReason, str]:
    """Why `place_task` found no runner for `model_id`. A model the cluster knows is unavailable for a moment (503
    with Retry-After), never not found: a placement of it is pending, an instance of it is placed and its runners
    are not up yet, or nodes that may serve it have not reported in full to this master (it was just elected, or
    they just joined). Only a model none of that covers is not found (404)."""
    pending = state.pending_placements.get(model_id)
    if pending is not None:
        return "model_unavailable", pending.reason
    placed = sorted(instance.instance_id for instance in state.instances.values() if instance.model_id == model_id)
    if placed:
        return "model_unavailable", f"model '{model_id}' is placed (instance {placed[0]}); its runners are not up yet"
    if unreported:
        waiting = ", ".join(sorted(unreported))
        return "model_unavailable", f"model '{model_id}' is not served by the nodes heard from; waiting for {waiting}"
    return "model_not_found", f"model '{model_id}' is not served by any node of the cluster"


def instance_serving(state: State, instance: PlacedInstance) -> bool:
    """Every rank of `instance` has a runner that is ready or running."""
    runners = [runner for runner in state.runners.values() if runner.instance_id == instance.instance_id]
    return len(runners) == len(instance.ranks) and all(runner.status in SERVING for runner in runners)


def replaced_instances(state: State) -> set[InstanceId]:
    """Degraded instances whose replacement over the nodes asked for is serving: they take no new tasks."""
    return {
        instance.replaces
        for instance in state.instances.values()
        if instance.replaces is not None and instance.replaces in state.instances and instance_serving(state, instance)
    }


def instance_busy(state: State, instance_id: InstanceId) -> bool:
    """A task is queued or running on a runner of the instance."""
    runners = {runner.runner_id for runner in state.runners.values() if runner.instance_id == instance_id}
    return any(task.runner_id in runners for task in state.tasks.values())


def failed_replacements(state: State) -> dict[InstanceId, str]:
    """Replacements of a degraded instance with a rank that failed (to load, to join the ring), and the error: they
    are removed so the model is placed again, while the degraded instance goes on serving."""
    failed: dict[InstanceId, str] = {}
    for instance in state.instances.values():
        if instance.replaces is None:
            continue
        for runner in state.runners.values():
            if runner.instance_id == instance.instance_id and runner.status == "failed":
                failed[instance.instance_id] = runner.last_error or "a rank failed"
    return failed
