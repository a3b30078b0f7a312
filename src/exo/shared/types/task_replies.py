"""What the worker running a task sends back to the node whose client asked for it, in order.

Accepted (or Refused), then each chunk with a sequence number, then StreamEnded. A refusal can also come from the
master when no runner serves the model.
"""

from typing import Annotated, Literal

from pydantic import Field, TypeAdapter

from exo.shared.types.chunks import Chunk
from exo.shared.types.common import CommandId, FrozenModel, NodeId, RunnerId, TaskId

RefusalReason = Literal["queue_full", "model_unavailable", "model_not_found"]


class TaskAccepted(FrozenModel):
    kind: Literal["task_accepted"] = "task_accepted"
    command_id: CommandId
    task_id: TaskId
    node_id: NodeId
    runner_id: RunnerId


class TaskRefused(FrozenModel):
    """The task never started: the queue is full, the model cannot load, or nothing serves it."""

    kind: Literal["task_refused"] = "task_refused"
    command_id: CommandId
    reason: RefusalReason
    message: str


class TaskChunkMessage(FrozenModel):
    kind: Literal["task_chunk"] = "task_chunk"
    task_id: TaskId
    # 0, 1, 2…: a gap means a chunk was lost, which ends the stream with an error instead of a corrupt answer.
    sequence: int
    chunk: Chunk


class TaskStreamEnded(FrozenModel):
    """No more chunks: the task finished, failed or was cancelled. `sequence` is the number of chunks sent."""

    kind: Literal["task_stream_ended"] = "task_stream_ended"
    task_id: TaskId
    sequence: int


TaskReply = Annotated[TaskAccepted | TaskRefused | TaskChunkMessage | TaskStreamEnded, Field(discriminator="kind")]
TaskReplyAdapter: TypeAdapter[TaskReply] = TypeAdapter(TaskReply)
