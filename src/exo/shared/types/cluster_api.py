"""What the /v1/cluster endpoints answer: flat, typed documents for agents and tools (the /state document is the
raw replicated state; these are views of it)."""

from typing import Literal

from pydantic import ConfigDict, Field

from exo.shared.types.common import FrozenModel
from exo.shared.types.footprint import WeightsInMemory
from exo.shared.types.instances import PendingPlacement
from exo.shared.types.runner_status import RunnerStatus
from exo.shared.types.state import MlxBackend, NodeStatus
from exo.shared.types.worker.shards import ParallelChoice, Parallelism


class ModelInstance(FrozenModel):
    """One served copy of a model; `rank`/`world_size` and the layer range say which part this runner holds."""

    instance_id: str
    runner_id: str
    node_id: str
    node_name: str
    status: RunnerStatus
    rank: int
    world_size: int
    start_layer: int
    end_layer: int | None


class ClusterModel(FrozenModel):
    model_id: str
    instances: list[ModelInstance]


class ClusterSummary(FrozenModel):
    """GET /v1/cluster: the cluster at a glance."""

    cluster: str
    # The node that answered, and the elected master.
    node_id: str
    master_node_id: str | None
    nodes_healthy: int
    nodes_degraded: int
    nodes_down: int
    # Summed over the nodes that are not down.
    memory_total_bytes: int
    memory_available_bytes: int
    models: list[ClusterModel]
    last_event_index: int


class ClusterNode(FrozenModel):
    """GET /v1/cluster/nodes/{node_id}: one node's facts, health and runners."""

    node_id: str
    # The name the node reports (`--node-name`, else its host name), and the one to show: the same, plus a short id
    # while another node of the cluster reports that name too.
    name: str
    display_name: str
    is_master: bool
    status: NodeStatus
    reason: str | None
    cluster_endpoints: list[str]
    api_port: int
    platform: str
    device: str
    mlx_backend: MlxBackend
    # How this node's runners hold weights (float32 or int8 on a Linux CPU per `--cpu-weights`, else as stored):
    # what placement plans its memory with.
    weights_in_memory: WeightsInMemory
    memory_total_bytes: int
    memory_available_bytes: int
    exo_version: str
    serves_models: bool
    started_at: float
    last_seen: float
    preparing: list[str]
    models: list[ClusterModel]


class ClusterNodeList(FrozenModel):
    object: Literal["list"] = "list"
    data: list[ClusterNode]


class RequestMetrics(FrozenModel):
    """Requests served since the runners started; timings are means over recent requests (None before any)."""

    requests_finished: int
    requests_failed: int
    requests_cancelled: int
    prompt_tokens: int
    generated_tokens: int
    time_to_first_token_seconds: float | None
    decode_tokens_per_second: float | None
    tasks_running: int
    queue_depth: int
    # Tokens generated over the last few seconds, counted as they are produced (not when requests end).
    tokens_per_second_now: float = 0.0


class NodeMetrics(RequestMetrics):
    node_id: str
    name: str
    status: NodeStatus
    memory_total_bytes: int
    memory_available_bytes: int


class ModelMetrics(RequestMetrics):
    model_id: str
    node_ids: list[str]


class ClusterMetrics(FrozenModel):
    """GET /v1/cluster/metrics: per node and per model (Prometheus text at GET /metrics)."""

    nodes: list[NodeMetrics]
    models: list[ModelMetrics]


class PeerRequest(FrozenModel):
    """POST /v1/cluster/peers body: the peer's cluster endpoint, `tcp/HOST:PORT` (port 52414 by default)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    endpoint: str


class PeerConnection(FrozenModel):
    endpoint: str
    # The peer's node id (its zenoh id).
    node_id: str
    # False when the peer answered but is not in this cluster (another --cluster name, or not an exo node).
    joined: bool


class DiscoveredPeer(FrozenModel):
    node_id: str
    endpoints: list[str]
    joined: bool


class DiscoveryReport(FrozenModel):
    """POST /v1/cluster/discover: the peers one multicast scan found (connected to, when they were not yet)."""

    found: list[DiscoveredPeer]


class InstanceRequest(FrozenModel):
    """POST /v1/cluster/instances body: place `model` (prepared on the node asked) over at least `min_nodes` nodes."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    model: str
    min_nodes: int = Field(default=1, ge=1)
    # Split by layers (pipeline), by matrices (tensor), or as the master's `auto` rule chooses (docs/CLUSTER.md).
    parallel: ParallelChoice = "auto"


class InstanceRank(FrozenModel):
    rank: int
    node_id: str
    node_name: str
    # Layers [start_layer, end_layer); in a pipeline rank 0 runs the last ones and streams the answers, in a tensor
    # split every rank runs them all (with 1/world_size of their heads and MLP columns).
    start_layer: int
    end_layer: int
    planned_bytes: int
    # This rank's runner, once its node started it (None while it copies its files).
    runner_id: str | None
    status: RunnerStatus | None


class PlacedInstanceView(FrozenModel):
    """One model placed over nodes by memory: its ranks, their layers and runners."""

    instance_id: str
    model_id: str
    min_nodes: int
    world_size: int
    # How the model is split over the ranks: by layers or by matrices.
    parallel: Parallelism = "pipeline"
    # Why this split: asked for, or what the `auto` rule weighed (docs/CLUSTER.md).
    parallel_reason: str | None = None
    # The node holding the whole checkpoint (the others copy their layers' files from it).
    files_from: str
    # Every rank's runner is ready: the instance serves requests.
    ready: bool
    placed_at: float
    ranks: list[InstanceRank]
    # Serving on fewer nodes than `min_nodes` (too few were up), and why; placed again over `min_nodes` when they are.
    degraded: bool = False
    degraded_reason: str | None = None
    # The degraded instance this one takes over from (retired once this one serves and it has finished its tasks).
    replaces: str | None = None


class InstanceList(FrozenModel):
    object: Literal["list"] = "list"
    data: list[PlacedInstanceView]
    # Models the cluster keeps placed that have no instance now, with why (their requests get a 503).
    unplaced: list[PendingPlacement] = Field(default_factory=list[PendingPlacement])
