"""Commands: what the API asks of the master, and what the master asks of workers, over the cluster bus."""

from typing import Annotated, Literal

from pydantic import Field, TypeAdapter

from exo.shared.types.common import CommandId, FrozenModel, ModelId, NodeId, RunnerId, TaskId
from exo.shared.types.instances import PlaceInstance
from exo.shared.types.tasks import GenerationParams, GenerationTask


class GenerateCommand(FrozenModel):
    """A completion the API validated (every wire protocol's adapter produces one)."""

    kind: Literal["generate"] = "generate"
    command_id: CommandId
    model_id: ModelId
    params: GenerationParams


class CancelTaskCommand(FrozenModel):
    """The client went away: stop generating for this task."""

    kind: Literal["cancel_task"] = "cancel_task"
    task_id: TaskId


# ---- API node → elected master -------------------------------------------------------------


class PlaceTask(FrozenModel):
    """Run `command` on a runner of its model, anywhere in the cluster; answers go to `requested_by`."""

    kind: Literal["place_task"] = "place_task"
    command: GenerateCommand
    requested_by: NodeId


MasterCommand = Annotated[PlaceTask | PlaceInstance, Field(discriminator="kind")]
MasterCommandAdapter: TypeAdapter[MasterCommand] = TypeAdapter(MasterCommand)


# ---- master → the worker that owns the runner (StopTask: from the node whose client left) ---


class AssignTask(FrozenModel):
    """Queue `task` on `runner_id`; its acceptance and chunks go to `reply_to` (see task_replies.py)."""

    kind: Literal["assign_task"] = "assign_task"
    command_id: CommandId
    task: GenerationTask
    runner_id: RunnerId
    reply_to: NodeId


class StopTask(FrozenModel):
    """Drop a queued task or stop a running one (its client went away)."""

    kind: Literal["stop_task"] = "stop_task"
    task_id: TaskId


WorkerCommand = Annotated[AssignTask | StopTask, Field(discriminator="kind")]
WorkerCommandAdapter: TypeAdapter[WorkerCommand] = TypeAdapter(WorkerCommand)
