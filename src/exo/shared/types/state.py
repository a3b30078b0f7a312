"""The node's observable state, served at GET /state. Changed only by applying events (see master/state.py)."""

from typing import Literal

from pydantic import Field

from exo.shared.types.common import FrozenModel, ModelId, NodeId, RunnerId, TaskId
from exo.shared.types.preparation import ModelPreparation
from exo.shared.types.worker.runner_response import ModelMetadata
from exo.shared.types.worker.runner_status import RunnerStatus
from exo.shared.types.worker.shards import ShardAssignment

TaskStatus = Literal["queued", "running"]
TaskOutcome = Literal["finished", "cancelled", "failed"]


class NodeInfo(FrozenModel):
    node_id: NodeId
    hostname: str
    platform: str
    api_port: int


class TaskSummary(FrozenModel):
    """How a task that left a runner ended: what /state keeps so faults (cancels, crashes) can be checked."""

    task_id: TaskId
    outcome: TaskOutcome
    # Tokens the runner generated for it; None when the runner died before reporting.
    generated_tokens: int | None
    finished_at: float


class RunnerInfo(FrozenModel):
    runner_id: RunnerId
    model_id: ModelId
    model_path: str
    shard: ShardAssignment
    status: RunnerStatus
    pid: int | None = None
    restarts: int = 0
    last_error: str | None = None
    metadata: ModelMetadata | None = None
    # The most recently ended tasks, oldest first (bounded), in the order the runner ran them.
    recent_tasks: tuple[TaskSummary, ...] = ()


class TaskInfo(FrozenModel):
    task_id: TaskId
    model_id: ModelId
    runner_id: RunnerId
    status: TaskStatus
    created_at: float


class State(FrozenModel):
    nodes: dict[NodeId, NodeInfo] = Field(default_factory=dict)
    runners: dict[RunnerId, RunnerInfo] = Field(default_factory=dict)
    tasks: dict[TaskId, TaskInfo] = Field(default_factory=dict)
    # Models being downloaded, assembled or converted before a runner can load them (and how that ended).
    preparations: dict[ModelId, ModelPreparation] = Field(default_factory=dict)
