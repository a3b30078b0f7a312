"""Identifiers and small literal types shared by every layer."""

import secrets
import string
from typing import Literal, NewType
from uuid import uuid4

from pydantic import BaseModel, ConfigDict

NodeId = NewType("NodeId", str)
# One served copy of a model: today one runner on one node; a model split across nodes is one instance of several
# runners, one per rank.
InstanceId = NewType("InstanceId", str)
RunnerId = NewType("RunnerId", str)
TaskId = NewType("TaskId", str)
CommandId = NewType("CommandId", str)
ModelId = NewType("ModelId", str)
ToolCallId = NewType("ToolCallId", str)

FinishReason = Literal["stop", "length", "tool_calls"]

_ALPHANUMERIC = string.ascii_letters + string.digits


class FrozenModel(BaseModel):
    """Base for every message that crosses a boundary: immutable and strict about unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def new_task_id() -> TaskId:
    return TaskId(uuid4().hex)


def new_command_id() -> CommandId:
    return CommandId(uuid4().hex)


def new_runner_id() -> RunnerId:
    return RunnerId(uuid4().hex[:12])


def new_instance_id() -> InstanceId:
    return InstanceId(uuid4().hex[:12])


def new_tool_call_id() -> ToolCallId:
    """OpenAI-style id: `call_` + 24 alphanumerics, random so ids never repeat across turns."""
    return ToolCallId("call_" + "".join(secrets.choice(_ALPHANUMERIC) for _ in range(24)))
