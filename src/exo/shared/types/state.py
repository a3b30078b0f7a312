"""The cluster's state, served at GET /state: the same document on every node once events settle.

Changed only by folding ordered events into it (master/state.py `apply`). Every entry but the master's own has an
owner node: a node reports its facts, runners and tasks, and the elected master adds what only it can see (who is
master, which nodes left).
"""

from typing import Literal

from pydantic import Field

from exo.shared.types.api_key import ApiKeyVerifier
from exo.shared.types.common import FrozenModel, InstanceId, ModelId, NodeId, RunnerId, TaskId
from exo.shared.types.cpu_kernels import CpuKernelsSetting, NodeCpuWeights
from exo.shared.types.footprint import WeightsInMemory, weights_in_memory
from exo.shared.types.instances import PendingPlacement, PlacedInstance
from exo.shared.types.links import LinkMeasurement
from exo.shared.types.preparation import ModelPreparation
from exo.shared.types.request_record import RequestRecord
from exo.shared.types.runner_status import RunnerStatus
from exo.shared.types.worker.runner_response import ModelDescription, ModelMetadata, RunnerMemory, StepTimes
from exo.shared.types.worker.shards import ShardAssignment

TaskStatus = Literal["queued", "running"]
# Where a task stands: waiting for its runner, reading its prompt, or generating.
TaskPhase = Literal["queued", "prefill", "decode"]
TaskOutcome = Literal["finished", "cancelled", "failed"]
NodeStatus = Literal["healthy", "degraded", "down"]
MlxBackend = Literal["cpu", "metal", "cuda"]


class NodeMemory(FrozenModel):
    """Memory as psutil sees it; `available_bytes` is what placement may plan with."""

    total_bytes: int
    available_bytes: int


class NodeFacts(FrozenModel):
    """What a node reports about itself (refreshed every few seconds)."""

    node_id: NodeId
    name: str
    # Where other nodes reach this node's cluster port: what `--peer` takes.
    cluster_endpoints: tuple[str, ...]
    api_port: int
    platform: str
    device: str
    mlx_backend: MlxBackend
    memory: NodeMemory
    exo_version: str
    # False for a `--no-model` node: it lends its memory and API but loads no model of its own.
    serves_models: bool
    started_at: float
    # Messages from the network this node dropped since it started (invalid, oversized or forged): a rising count
    # means a misbehaving peer or someone probing the cluster port.
    dropped_messages: int = 0
    # A verifier of the node's `--api-key` (None without one): every node of the cluster then requires a key.
    # Carried on the cluster's links only; the API never shows it.
    api_key_verifier: ApiKeyVerifier | None = None
    # The node's `--cpu-kernels` setting, which its runners load models under (placement plans with it).
    cpu_kernels: CpuKernelsSetting = "auto"
    # The node's `--cpu-weights` with `auto` resolved for this machine (`gguf_or_q8_0`: ggml found, each model's kept
    # GGUF else Q8_0; float32 without ggml): what its runners hold where the CPU engine applies (placement plans with
    # it; each runner's report says what it holds).
    cpu_weights: NodeCpuWeights = "float32"
    # The round trip to each peer this node measured (cluster/link_probe.py): what `auto` weighs a split's
    # exchanges with. A peer not measured yet (just joined) is absent.
    links: dict[NodeId, LinkMeasurement] = Field(default_factory=dict[NodeId, LinkMeasurement])
    # Bytes per second this node's CPU copies through memory (cluster/memory_bandwidth.py), measured once at start:
    # what `auto` turns a model's bytes read per token into time with. None where it was not measured.
    memory_bandwidth_bytes_per_second: float | None = None

    @property
    def weights_in_memory(self) -> WeightsInMemory:
        """How this node's runners hold weights (`footprint.weights_in_memory`)."""
        return weights_in_memory(self.mlx_backend, self.cpu_kernels, self.cpu_weights)


class NodeHealth(FrozenModel):
    status: NodeStatus
    # Why the node is not healthy; None when it is.
    reason: str | None = None


class NodeInfo(FrozenModel):
    facts: NodeFacts
    # The name to show: the node's own, plus a short id while another node of the cluster has the same name.
    display_name: str = ""
    # The `--model` specs (or "default") the node is resolving right now: their requests get a 503 until then.
    preparing: tuple[str, ...] = ()
    # Downloads, GGUF assembly and conversions the node ran for its models, with progress (and how they ended).
    preparations: dict[ModelId, ModelPreparation] = Field(default_factory=dict)
    # When the master last ordered an event from this node (the master's clock).
    last_seen: float
    health: NodeHealth
    # The requests this node's API took that ended most recently, oldest first (RECENT_REQUESTS_PER_NODE at most).
    recent_requests: tuple[RequestRecord, ...] = ()


class TaskSummary(FrozenModel):
    """How a task that left a runner ended: what /state keeps so faults (cancels, crashes) can be checked."""

    task_id: TaskId
    outcome: TaskOutcome
    # Tokens the runner generated for it; None when the runner died before reporting.
    generated_tokens: int | None
    finished_at: float


class RunnerMetrics(FrozenModel):
    """What a runner has served since it was registered, measured on its node.

    Time to first token runs from the worker accepting the task to its first chunk (queueing included); decode
    speed is completion tokens over the time after the first chunk. Both are means over recent requests.
    """

    requests_finished: int = 0
    requests_failed: int = 0
    requests_cancelled: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    time_to_first_token_seconds: float | None = None
    decode_tokens_per_second: float | None = None
    repeated_tool_calls: int = 0
    """Calls identical to one whose result the conversation already held (the agent-loop guard's count)."""
    withdrawn_tool_calls: int = 0
    """Of those, the calls the loop guard's `answer` took back."""


class RunnerInfo(FrozenModel):
    runner_id: RunnerId
    node_id: NodeId
    # The instance this runner is a shard of: its own for a whole model, a placed instance's for a pipeline rank.
    instance_id: InstanceId
    model_id: ModelId
    model_path: str
    shard: ShardAssignment
    status: RunnerStatus
    pid: int | None = None
    restarts: int = 0
    last_error: str | None = None
    metadata: ModelMetadata | None = None
    # While the runner loads (no metadata yet): what it read of the model before its weights (model listings use it).
    description: ModelDescription | None = None
    # The most recently ended tasks, oldest first (bounded), in the order the runner ran them.
    recent_tasks: tuple[TaskSummary, ...] = ()
    metrics: RunnerMetrics = Field(default_factory=RunnerMetrics)
    # Tokens generated over the last few seconds, counted as they are produced (refreshed about once a second while
    # the runner generates; 0 a few seconds after it stops).
    tokens_per_second_now: float = 0.0
    # The host-overhead meter: decode-step times since the runner started, by requests decoding in the step.
    step_times: dict[int, StepTimes] = Field(default_factory=dict[int, StepTimes])
    # Prompt pieces prefilled since the runner started, by how many prompts each one fed together.
    prefill_pieces: dict[int, int] = Field(default_factory=dict[int, int])
    # ggml's thread count as of the runner's last finished task (`--cpu-weights q8_0` / `gguf` on a CPU: it follows
    # the cores other processes leave); None where the runner runs no ggml products.
    ggml_threads: int | None = None
    # The runner process's resident set size when its node last reported (every few seconds and on each change);
    # None while no runner process is alive.
    resident_bytes: int | None = None
    # The runner's own account of its memory (mlx's arrays and cache, the prefix cache's tiers) as of the last task it
    # ended or its last turn to idle.
    memory: RunnerMemory | None = None

    @property
    def described(self) -> ModelDescription | None:
        """What the runner reported of its model: when it loaded, or while loading what it read before the weights."""
        return self.metadata if self.metadata is not None else self.description


class TaskInfo(FrozenModel):
    task_id: TaskId
    model_id: ModelId
    runner_id: RunnerId
    # The node whose runner holds the task, and the node whose API client asked for it (they differ when the
    # request was forwarded).
    node_id: NodeId
    requested_by: NodeId
    status: TaskStatus
    created_at: float
    phase: TaskPhase = "queued"
    # How far the runner has read the prompt (None until it starts): tokens computed or taken from the prefix cache
    # so far, of the whole prompt, and how many of them the cache gave.
    prompt_tokens: int | None = None
    done_tokens: int | None = None
    cached_tokens: int | None = None


class State(FrozenModel):
    master_node_id: NodeId | None = None
    # Index of the last event folded in; equal on two nodes means they hold the same state.
    last_event_index: int = 0
    nodes: dict[NodeId, NodeInfo] = Field(default_factory=dict)
    runners: dict[RunnerId, RunnerInfo] = Field(default_factory=dict)
    tasks: dict[TaskId, TaskInfo] = Field(default_factory=dict)
    # Models the master placed over several nodes (by memory); each node runs the ranks placed on it.
    instances: dict[InstanceId, PlacedInstance] = Field(default_factory=dict)
    # Models the cluster keeps placed that have no instance now (a node left, or they fit nowhere yet), with why.
    pending_placements: dict[ModelId, PendingPlacement] = Field(default_factory=dict)
