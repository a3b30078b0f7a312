"""Commands the API sends to the master."""

from typing import Literal

from exo.shared.types.common import CommandId, FrozenModel, ModelId, TaskId
from exo.shared.types.tasks import ChatCompletionTaskParams


class ChatCompletionCommand(FrozenModel):
    kind: Literal["chat_completion"] = "chat_completion"
    command_id: CommandId
    model_id: ModelId
    params: ChatCompletionTaskParams


class CancelTaskCommand(FrozenModel):
    """The client went away: stop generating for this task."""

    kind: Literal["cancel_task"] = "cancel_task"
    task_id: TaskId


Command = ChatCompletionCommand | CancelTaskCommand
