"""The fold every node runs: `apply(state, event)` is pure, so every node that applies the master's events in order
holds the same state, and the rules are tested without processes or a network."""

from collections.abc import Iterable

from exo.shared.node_names import display_names
from exo.shared.types.common import NodeId
from exo.shared.types.event_log import IndexedEvent
from exo.shared.types.events import (
    InstancePlaced,
    InstanceRemoved,
    MasterElected,
    NodeDown,
    NodeReported,
    NodeStale,
    PlacementPending,
    PreparationUpdated,
    RequestEnded,
    RunnerUpdated,
    TaskFinished,
    TaskUpdated,
)
from exo.shared.types.request_record import RECENT_REQUESTS_PER_NODE
from exo.shared.types.state import NodeFacts, NodeHealth, NodeInfo, RunnerInfo, State

# Below this share of memory available a node is degraded: loading or growing a KV cache there may fail.
LOW_MEMORY_FRACTION = 0.05
_MIB = 1024 * 1024


def apply(state: State, indexed: IndexedEvent) -> State:
    """Return the state after the master's event `indexed`: the event's effect, its origin seen, the index advanced."""
    after = _apply_event(state, indexed)
    origin = after.nodes.get(indexed.origin)
    if origin is not None and origin.health.status != "down":
        after = _with_node(after, origin.model_copy(update={"last_seen": indexed.ordered_at}))
    return after.model_copy(update={"last_event_index": indexed.index})


def _apply_event(state: State, indexed: IndexedEvent) -> State:
    match indexed.event:
        case NodeReported(facts=facts, runners=runners, tasks=tasks) as report:
            node_id = facts.node_id
            kept_runners = {key: runner for key, runner in state.runners.items() if runner.node_id != node_id}
            kept_tasks = {key: task for key, task in state.tasks.items() if task.node_id != node_id}
            owned_runners = {runner.runner_id: runner for runner in runners if runner.node_id == node_id}
            owned_tasks = {task.task_id: task for task in tasks if task.node_id == node_id}
            node = NodeInfo(
                facts=facts,
                preparing=report.preparing,
                preparations=report.preparations,
                last_seen=indexed.ordered_at,
                health=node_health(facts, owned_runners.values()),
                recent_requests=report.recent_requests[-RECENT_REQUESTS_PER_NODE:],
            )
            return state.model_copy(
                update={
                    "nodes": _with_display_names({**state.nodes, node_id: node}),
                    "runners": {**kept_runners, **owned_runners},
                    "tasks": {**kept_tasks, **owned_tasks},
                }
            )
        case RunnerUpdated(runner=runner):
            if not is_up(state, runner.node_id):
                return state  # a report that was still in flight when its node left
            after = state.model_copy(update={"runners": {**state.runners, runner.runner_id: runner}})
            return _refresh_health(after, runner.node_id)
        case TaskUpdated(task=task):
            if not is_up(state, task.node_id):
                return state
            return state.model_copy(update={"tasks": {**state.tasks, task.task_id: task}})
        case TaskFinished(task_id=task_id):
            return state.model_copy(update={"tasks": {k: v for k, v in state.tasks.items() if k != task_id}})
        case PreparationUpdated(preparation=preparation):
            node = state.nodes.get(indexed.origin)
            if node is None or node.health.status == "down":
                return state
            preparations = {**node.preparations, preparation.model_id: preparation}
            return _with_node(state, node.model_copy(update={"preparations": preparations}))
        case RequestEnded(record=record):
            node = state.nodes.get(indexed.origin)
            if node is None or node.health.status == "down":
                return state
            recent = (*node.recent_requests, record)[-RECENT_REQUESTS_PER_NODE:]
            return _with_node(state, node.model_copy(update={"recent_requests": recent}))
        case MasterElected(node_id=node_id):
            return state.model_copy(update={"master_node_id": node_id})
        case NodeDown(node_id=node_id, reason=reason):
            node = state.nodes.get(node_id)
            if node is None:
                return state
            down = node.model_copy(update={"health": NodeHealth(status="down", reason=reason), "preparing": ()})
            return _with_node(state, down).model_copy(
                update={
                    "runners": {k: v for k, v in state.runners.items() if v.node_id != node_id},
                    "tasks": {k: v for k, v in state.tasks.items() if v.node_id != node_id},
                }
            )
        case InstancePlaced(instance=instance):
            pending = {k: v for k, v in state.pending_placements.items() if k != instance.model_id}
            instances = {**state.instances, instance.instance_id: instance}
            return state.model_copy(update={"instances": instances, "pending_placements": pending})
        case PlacementPending(pending=pending):
            return state.model_copy(
                update={"pending_placements": {**state.pending_placements, pending.model_id: pending}}
            )
        case InstanceRemoved(instance_id=instance_id):
            return state.model_copy(
                update={"instances": {k: v for k, v in state.instances.items() if k != instance_id}}
            )
        case NodeStale(node_id=node_id, silent_seconds=silent):
            node = state.nodes.get(node_id)
            if node is None or node.health.status == "down":
                return state
            reason = f"no report for {silent:.0f} s"
            return _with_node(state, node.model_copy(update={"health": NodeHealth(status="degraded", reason=reason)}))


def node_health(facts: NodeFacts, runners: Iterable[RunnerInfo]) -> NodeHealth:
    """Healthy, or degraded with the first reason found: a failed runner, then low memory."""
    for runner in runners:
        if runner.status == "failed":
            return NodeHealth(status="degraded", reason=f"runner for {runner.model_id} failed: {runner.last_error}")
    memory = facts.memory
    if memory.total_bytes > 0 and memory.available_bytes < LOW_MEMORY_FRACTION * memory.total_bytes:
        return NodeHealth(status="degraded", reason=f"low memory: {memory.available_bytes // _MIB} MiB available")
    return NodeHealth(status="healthy")


def is_up(state: State, node_id: NodeId) -> bool:
    """The node is known and has not left."""
    node = state.nodes.get(node_id)
    return node is not None and node.health.status != "down"


def _with_display_names(nodes: dict[NodeId, NodeInfo]) -> dict[NodeId, NodeInfo]:
    """`nodes` with each display name up to date (a report may bring a name another node already has)."""
    names = display_names(nodes)
    return {
        node_id: node.model_copy(update={"display_name": names[node_id]})
        if node.display_name != names[node_id]
        else node
        for node_id, node in nodes.items()
    }


def _with_node(state: State, node: NodeInfo) -> State:
    return state.model_copy(update={"nodes": {**state.nodes, node.facts.node_id: node}})


def _refresh_health(state: State, node_id: NodeId) -> State:
    node = state.nodes.get(node_id)
    if node is None:
        return state
    runners = (runner for runner in state.runners.values() if runner.node_id == node_id)
    return _with_node(state, node.model_copy(update={"health": node_health(node.facts, runners)}))
