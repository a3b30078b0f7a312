"""Events: facts that happened on the node. The state is the fold of these (master/state.py `apply`)."""

from typing import Literal

from exo.shared.types.common import FrozenModel, TaskId
from exo.shared.types.preparation import ModelPreparation
from exo.shared.types.state import NodeInfo, RunnerInfo, TaskInfo


class NodeJoined(FrozenModel):
    kind: Literal["node_joined"] = "node_joined"
    node: NodeInfo


class RunnerUpdated(FrozenModel):
    kind: Literal["runner_updated"] = "runner_updated"
    runner: RunnerInfo


class TaskUpdated(FrozenModel):
    kind: Literal["task_updated"] = "task_updated"
    task: TaskInfo


class TaskFinished(FrozenModel):
    kind: Literal["task_finished"] = "task_finished"
    task_id: TaskId


class PreparationUpdated(FrozenModel):
    kind: Literal["preparation_updated"] = "preparation_updated"
    preparation: ModelPreparation


Event = NodeJoined | RunnerUpdated | TaskUpdated | TaskFinished | PreparationUpdated
