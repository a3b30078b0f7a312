"""Views of the cluster state for the /v1/cluster endpoints: pure functions, so they are tested without a network."""

from collections.abc import Iterable

from exo.shared.node_names import shown_name
from exo.shared.types.cluster_api import (
    ClusterMetrics,
    ClusterModel,
    ClusterNode,
    ClusterSummary,
    InstanceRank,
    ModelInstance,
    ModelMetrics,
    NodeMetrics,
    PlacedInstanceView,
    RequestMetrics,
)
from exo.shared.types.common import NodeId
from exo.shared.types.instances import PlacedInstance
from exo.shared.types.state import NodeInfo, RunnerInfo, State


def cluster_summary(state: State, cluster: str, node_id: NodeId) -> ClusterSummary:
    """The cluster at a glance, as seen by `node_id`."""
    nodes = state.nodes.values()
    present = [node for node in nodes if node.health.status != "down"]
    return ClusterSummary(
        cluster=cluster,
        node_id=node_id,
        master_node_id=state.master_node_id,
        nodes_healthy=sum(node.health.status == "healthy" for node in nodes),
        nodes_degraded=sum(node.health.status == "degraded" for node in nodes),
        nodes_down=sum(node.health.status == "down" for node in nodes),
        memory_total_bytes=sum(node.facts.memory.total_bytes for node in present),
        memory_available_bytes=sum(node.facts.memory.available_bytes for node in present),
        models=cluster_models(state, state.runners.values()),
        last_event_index=state.last_event_index,
    )


def cluster_models(state: State, runners: Iterable[RunnerInfo]) -> list[ClusterModel]:
    """`runners` grouped by model, each with the node it runs on."""
    by_model: dict[str, list[ModelInstance]] = {}
    for runner in runners:
        node = state.nodes.get(runner.node_id)
        by_model.setdefault(runner.model_id, []).append(
            ModelInstance(
                instance_id=runner.instance_id,
                runner_id=runner.runner_id,
                node_id=runner.node_id,
                node_name=shown_name(node) if node is not None else "unknown",
                status=runner.status,
                rank=runner.shard.rank,
                world_size=runner.shard.world_size,
                start_layer=runner.shard.start_layer,
                end_layer=runner.shard.end_layer,
            )
        )
    return [
        ClusterModel(model_id=model_id, instances=sorted(instances, key=lambda instance: instance.runner_id))
        for model_id, instances in sorted(by_model.items())
    ]


def cluster_node(state: State, node: NodeInfo) -> ClusterNode:
    facts = node.facts
    return ClusterNode(
        node_id=facts.node_id,
        name=facts.name,
        display_name=shown_name(node),
        is_master=state.master_node_id == facts.node_id,
        status=node.health.status,
        reason=node.health.reason,
        cluster_endpoints=list(facts.cluster_endpoints),
        api_port=facts.api_port,
        platform=facts.platform,
        device=facts.device,
        mlx_backend=facts.mlx_backend,
        weights_in_memory=facts.weights_in_memory,
        memory_total_bytes=facts.memory.total_bytes,
        memory_available_bytes=facts.memory.available_bytes,
        exo_version=facts.exo_version,
        serves_models=facts.serves_models,
        started_at=facts.started_at,
        last_seen=node.last_seen,
        preparing=list(node.preparing),
        models=cluster_models(state, (r for r in state.runners.values() if r.node_id == facts.node_id)),
    )


def cluster_nodes(state: State) -> list[ClusterNode]:
    """Every node the cluster has seen, down ones included, by name then id."""
    nodes = sorted(state.nodes.values(), key=lambda node: (node.facts.name, node.facts.node_id))
    return [cluster_node(state, node) for node in nodes]


def _request_metrics(state: State, runners: list[RunnerInfo]) -> RequestMetrics:
    """Counters summed over `runners`; timing means weighted by the requests each runner finished."""
    runner_ids = {runner.runner_id for runner in runners}
    tasks = [task for task in state.tasks.values() if task.runner_id in runner_ids]
    return RequestMetrics(
        requests_finished=sum(runner.metrics.requests_finished for runner in runners),
        requests_failed=sum(runner.metrics.requests_failed for runner in runners),
        requests_cancelled=sum(runner.metrics.requests_cancelled for runner in runners),
        prompt_tokens=sum(runner.metrics.prompt_tokens for runner in runners),
        generated_tokens=sum(runner.metrics.generated_tokens for runner in runners),
        time_to_first_token_seconds=_weighted_mean(
            (runner.metrics.time_to_first_token_seconds, runner.metrics.requests_finished) for runner in runners
        ),
        decode_tokens_per_second=_weighted_mean(
            (runner.metrics.decode_tokens_per_second, runner.metrics.requests_finished) for runner in runners
        ),
        tasks_running=sum(task.status == "running" for task in tasks),
        queue_depth=sum(task.status == "queued" for task in tasks),
        tokens_per_second_now=round(sum(runner.tokens_per_second_now for runner in runners), 2),
    )


def _weighted_mean(values: Iterable[tuple[float | None, int]]) -> float | None:
    present = [(value, max(weight, 1)) for value, weight in values if value is not None]
    if not present:
        return None
    return sum(value * weight for value, weight in present) / sum(weight for _, weight in present)


def cluster_metrics(state: State) -> ClusterMetrics:
    nodes: list[NodeMetrics] = []
    for node in sorted(state.nodes.values(), key=lambda node: (node.facts.name, node.facts.node_id)):
        runners = [runner for runner in state.runners.values() if runner.node_id == node.facts.node_id]
        nodes.append(
            NodeMetrics(
                **_request_metrics(state, runners).model_dump(),
                node_id=node.facts.node_id,
                name=shown_name(node),
                status=node.health.status,
                memory_total_bytes=node.facts.memory.total_bytes,
                memory_available_bytes=node.facts.memory.available_bytes,
            )
        )
    models: list[ModelMetrics] = []
    for model_id in sorted({runner.model_id for runner in state.runners.values()}):
        runners = [runner for runner in state.runners.values() if runner.model_id == model_id]
        models.append(
            ModelMetrics(
                **_request_metrics(state, runners).model_dump(),
                model_id=model_id,
                node_ids=sorted({runner.node_id for runner in runners}),
            )
        )
    return ClusterMetrics(nodes=nodes, models=models)


def placed_instance_view(state: State, instance: PlacedInstance) -> PlacedInstanceView:
    """An instance with each rank's node name and runner (as its node last reported it)."""
    ranks: list[InstanceRank] = []
    for placement in instance.ranks:
        runner = next(
            (
                runner
                for runner in state.runners.values()
                if runner.instance_id == instance.instance_id and runner.shard.rank == placement.rank
            ),
            None,
        )
        node = state.nodes.get(placement.node_id)
        ranks.append(
            InstanceRank(
                rank=placement.rank,
                node_id=placement.node_id,
                node_name=shown_name(node) if node is not None else "unknown",
                start_layer=placement.start_layer,
                end_layer=placement.end_layer,
                planned_bytes=placement.planned_bytes,
                runner_id=runner.runner_id if runner is not None else None,
                status=runner.status if runner is not None else None,
            )
        )
    return PlacedInstanceView(
        instance_id=instance.instance_id,
        model_id=instance.model_id,
        min_nodes=instance.min_nodes,
        world_size=len(instance.ranks),
        parallel=instance.parallel,
        parallel_reason=instance.parallel_reason,
        files_from=instance.files_from,
        ready=all(rank.status == "ready" for rank in ranks),
        placed_at=instance.placed_at,
        ranks=ranks,
        degraded=instance.degraded_reason is not None,
        degraded_reason=instance.degraded_reason,
        replaces=instance.replaces,
    )
