"""A command goes to the master its sender follows, and only that master hears it, over real zenoh sessions.

A node that has just started is its own master until it has confirmed the others' tokens, with a state that knows
nothing yet. When every master heard every command, it answered the cluster's requests meanwhile: a chat request for
a model the cluster serves was refused as not found (a 404, whenever that refusal beat the real master's answer),
and a placement as 'its node is down'. Here both masters are active, as they are in that moment.
"""

from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream
from pydantic import BaseModel

from exo.cluster.bus import Bus
from exo.cluster.event_log import EventLog
from exo.cluster.membership import Membership
from exo.cluster.topics import Member, Topics
from exo.master.main import Master
from exo.shared.types.commands import AssignTask, GenerateCommand, PlaceTask, WorkerCommand, WorkerCommandAdapter
from exo.shared.types.common import CommandId, ModelId, NodeId
from exo.shared.types.footprint import ModelFootprint
from exo.shared.types.instances import InstancePlacementReply, InstancePlacementReplyAdapter, PlaceInstance
from exo.shared.types.task_replies import TaskRefused, TaskReply, TaskReplyAdapter
from exo.shared.types.tasks import GenerationParams, PromptMessage
from tests.cluster.buses import linked_buses
from tests.shared.state_builders import NODE_A, NODE_B, fold, reported, runner

T = TypeVar("T")
MODEL = ModelId("model-x")
SITTING, NEWBORN = NODE_A, NODE_B
FOOTPRINT = ModelFootprint(
    layer_parameters=(1000,) * 4, shared_parameters=1000, layer_file_bytes=(2000,) * 4, shared_file_bytes=2000
)
# How long to listen for an answer that must not come (the wanted answer already came over the same link).
QUIET_S = 1.0


@dataclass
class _Link:
    """The sitting master's node: its bus, and what it receives (task replies, its worker's commands, placements)."""

    bus: Bus
    topics: Topics
    replies: MemoryObjectReceiveStream[TaskReply]
    assignments: MemoryObjectReceiveStream[WorkerCommand]
    placements: MemoryObjectReceiveStream[InstancePlacementReply]


@asynccontextmanager
async def _two_masters() -> AsyncGenerator[_Link]:
    """The sitting master (its node serves MODEL) and a newborn one (an empty state), both active and linked, once
    the newborn one is seen to answer a command sent to it (so it would hear one sent to the sitting master)."""
    topics = Topics("addressing")
    async with linked_buses(2) as (sitting_bus, newborn_bus):
        link = _Link(
            bus=sitting_bus,
            topics=topics,
            replies=sitting_bus.subscribe(topics.task_replies(SITTING), TaskReplyAdapter),
            assignments=sitting_bus.subscribe(topics.worker_commands(SITTING), WorkerCommandAdapter),
            placements=sitting_bus.subscribe(topics.instance_replies(SITTING), InstancePlacementReplyAdapter),
        )
        async with anyio.create_task_group() as group:
            _start_master(group, sitting_bus, topics, Member(SITTING, 100), serving=True)
            _start_master(group, newborn_bus, topics, Member(NEWBORN, 200), serving=False)
            refused = await _send_until_answered(link, NEWBORN, _place_task("to-newborn"), link.replies)
            assert isinstance(refused, TaskRefused)
            assert refused.command_id == "to-newborn"
            await _drain(link.replies)
            assert await _drain(link.assignments) == []  # the sitting master never heard it
            yield link
            group.cancel_scope.cancel()


def _start_master(group: TaskGroup, bus: Bus, topics: Topics, me: Member, *, serving: bool) -> None:
    # The membership does not run: each node sees only itself, so each is master, as a node is when it starts.
    membership = Membership(bus, topics, me)
    event_log = EventLog(bus, topics, membership)
    if serving:
        event_log.state = fold((reported(me.node_id, runner("r1", me.node_id, MODEL)), me.node_id))
    group.start_soon(Master(bus, topics, membership, event_log).run)


def _place_task(command_id: str) -> PlaceTask:
    params = GenerationParams(messages=(PromptMessage(role="user", content="Hello!"),))
    command = GenerateCommand(command_id=CommandId(command_id), model_id=MODEL, params=params)
    return PlaceTask(command=command, requested_by=SITTING)


async def _send_until_answered(
    link: _Link, master: NodeId, command: BaseModel, answers: MemoryObjectReceiveStream[T]
) -> T:
    """Send `command` to `master` until an answer arrives (zenoh links and subscriptions take a moment)."""
    with anyio.fail_after(20):
        while True:
            link.bus.publish(link.topics.master_commands(master), command)
            with anyio.move_on_after(0.3):
                return await answers.receive()


async def _drain(answers: MemoryObjectReceiveStream[T]) -> list[T]:
    received: list[T] = []
    with anyio.move_on_after(QUIET_S):
        while True:
            received.append(await answers.receive())
    return received


async def test_a_task_sent_to_the_sitting_master_is_assigned_and_the_newborn_master_never_refuses_it() -> None:
    async with _two_masters() as link:
        assigned = await _send_until_answered(link, SITTING, _place_task("to-sitting"), link.assignments)
        assert isinstance(assigned, AssignTask)
        assert (assigned.command_id, assigned.runner_id) == ("to-sitting", "r1")
        assert await _drain(link.replies) == []


async def test_a_placement_sent_to_the_sitting_master_is_answered_by_it_alone() -> None:
    async with _two_masters() as link:
        request = PlaceInstance(
            request_id=CommandId("place-1"), model_id=MODEL, min_nodes=1, footprint=FOOTPRINT, files_from=SITTING
        )
        # The newborn master's state has no node: had it answered, it would say that the sitting node is down.
        first = await _send_until_answered(link, SITTING, request, link.placements)
        replies = [first, *await _drain(link.placements)]
        assert all(reply.error is None for reply in replies), replies
        assert {rank.node_id for reply in replies if reply.instance for rank in reply.instance.ranks} == {SITTING}
