"""Small builders for cluster state objects, so state and view tests read as the situation they set up."""

from exo.shared.apply import apply
from exo.shared.types.common import InstanceId, ModelId, NodeId, RunnerId, TaskId
from exo.shared.types.cpu_kernels import CpuKernelsSetting, NodeCpuWeights
from exo.shared.types.event_log import IndexedEvent
from exo.shared.types.events import Event, NodeReported
from exo.shared.types.runner_status import RunnerStatus
from exo.shared.types.state import (
    NodeFacts,
    NodeMemory,
    RunnerInfo,
    RunnerMetrics,
    State,
    TaskInfo,
    TaskStatus,
)
from exo.shared.types.worker.shards import PipelinePeers, ShardAssignment, pipeline_shards

NODE_A = NodeId("a0000000000000000000000000000001")
NODE_B = NodeId("b0000000000000000000000000000002")
NODE_C = NodeId("c0000000000000000000000000000003")
GIB = 1024**3


def facts(
    node_id: NodeId,
    *,
    name: str | None = None,
    total_gib: int = 16,
    available_gib: float = 8,
    cpu_kernels: CpuKernelsSetting = "auto",
    cpu_weights: NodeCpuWeights = "float32",
) -> NodeFacts:
    return NodeFacts(
        node_id=node_id,
        name=name or f"node-{node_id[0]}",
        cluster_endpoints=(f"tcp/10.0.0.{ord(node_id[0]) % 200}:52414",),
        api_port=52415,
        platform="Linux",
        device="test cpu (2 cores)",
        mlx_backend="cpu",
        memory=NodeMemory(total_bytes=total_gib * GIB, available_bytes=int(available_gib * GIB)),
        exo_version="0.1.0",
        serves_models=True,
        started_at=100.0,
        cpu_kernels=cpu_kernels,
        cpu_weights=cpu_weights,
    )


def runner(
    runner_id: str,
    node_id: NodeId,
    model_id: str = "model-x",
    *,
    status: RunnerStatus = "ready",
    rank: int = 0,
    world_size: int = 1,
    last_error: str | None = None,
    metrics: RunnerMetrics | None = None,
) -> RunnerInfo:
    return RunnerInfo(
        runner_id=RunnerId(runner_id),
        node_id=node_id,
        instance_id=InstanceId(f"instance-{runner_id}"),
        model_id=ModelId(model_id),
        model_path=f"/models/{model_id}",
        shard=_shard(rank, world_size),
        status=status,
        last_error=last_error,
        metrics=metrics or RunnerMetrics(),
    )


def _shard(rank: int, world_size: int) -> ShardAssignment:
    """Rank `rank` of a pipeline of `world_size` ranks, one layer each (a whole model for world size 1)."""
    if world_size == 1:
        return ShardAssignment()
    peers = PipelinePeers(
        ring_addresses=tuple(f"127.0.0.1:{21000 + index}" for index in range(world_size)),
        task_address="127.0.0.1:21999",
        layer_counts=(1,) * world_size,
    )
    return pipeline_shards(peers)[rank]


def task(
    task_id: str, runner_info: RunnerInfo, *, status: TaskStatus = "queued", requested_by: NodeId | None = None
) -> TaskInfo:
    return TaskInfo(
        task_id=TaskId(task_id),
        model_id=runner_info.model_id,
        runner_id=runner_info.runner_id,
        node_id=runner_info.node_id,
        requested_by=requested_by or runner_info.node_id,
        status=status,
        created_at=1.0,
    )


def reported(
    node_id: NodeId,
    *runners: RunnerInfo,
    tasks: tuple[TaskInfo, ...] = (),
    available_gib: float = 8,
    cpu_kernels: CpuKernelsSetting = "auto",
    cpu_weights: NodeCpuWeights = "float32",
) -> NodeReported:
    node_facts = facts(node_id, available_gib=available_gib, cpu_kernels=cpu_kernels, cpu_weights=cpu_weights)
    return NodeReported(facts=node_facts, runners=runners, tasks=tasks)


def indexed(
    event: Event, index: int, *, origin: NodeId = NODE_A, at: float = 1000.0, leader: NodeId = NODE_A
) -> IndexedEvent:
    return IndexedEvent(leader=leader, index=index, ordered_at=at, origin=origin, event=event)


def fold(*steps: tuple[Event, NodeId], start: State | None = None, at: float = 1000.0) -> State:
    """Apply (event, origin) pairs in order, numbering them after `start`'s last index."""
    state = start or State()
    for event, origin in steps:
        state = apply(state, indexed(event, state.last_event_index + 1, origin=origin, at=at))
    return state
