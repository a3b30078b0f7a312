"""The bus carries typed messages between real zenoh sessions and drops anything that does not validate."""

import logging

import anyio
import pytest
from anyio.streams.memory import MemoryObjectReceiveStream
from pydantic import TypeAdapter

from exo.cluster import bus as bus_module
from exo.cluster.bus import Bus
from exo.shared.types.commands import StopTask, WorkerCommand, WorkerCommandAdapter
from exo.shared.types.common import TaskId
from exo.shared.types.event_log import StateSnapshot, StateSnapshotAdapter
from exo.shared.types.state import State
from tests.cluster.buses import eventually, linked_buses
from tests.shared.state_builders import NODE_A

KEY = "exo/test/v1/workers/somebody"


async def first_delivery(sender: Bus, messages: MemoryObjectReceiveStream[WorkerCommand]) -> WorkerCommand:
    """Publish until the subscription has reached the sender (zenoh links and declarations take a moment)."""
    received: WorkerCommand | None = None
    with anyio.fail_after(20):
        while received is None:
            sender.publish(KEY, StopTask(task_id=TaskId("hello")))
            with anyio.move_on_after(0.2):
                received = await messages.receive()
    with anyio.move_on_after(0.5):  # drain the copies the retries sent
        while True:
            await messages.receive()
    return received


async def test_a_typed_message_crosses_to_another_session() -> None:
    async with linked_buses(2) as (sender, receiver):
        messages = receiver.subscribe(KEY, WorkerCommandAdapter)
        assert await first_delivery(sender, messages) == StopTask(task_id=TaskId("hello"))


async def test_what_a_node_publishes_to_its_own_inbox_is_handed_over_at_once_in_order() -> None:
    """A node's inbox (its task replies) gets its own messages as the objects published, in order, without the
    round trip through zenoh; another node's messages to it still arrive through zenoh."""
    async with linked_buses(2) as (other, own):
        replies = own.subscribe(KEY, WorkerCommandAdapter, inbox=True)
        assert await first_delivery(other, replies) == StopTask(task_id=TaskId("hello"))
        sent = [StopTask(task_id=TaskId(f"mine-{index}")) for index in range(50)]
        for message in sent:
            own.publish(KEY, message)
        received = [replies.receive_nowait() for _ in sent]  # already there: nothing went through zenoh
        assert all(got is message for got, message in zip(received, sent, strict=True))


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        (b"not json at all", "Invalid JSON"),
        (b'{"kind": "stop_task"}', "task_id"),
        (b'{"kind": "launch_missiles", "task_id": "t"}', "does not match any of the expected tags"),
        (b'{"kind": "stop_task", "task_id": "t", "extra": 1}', "Extra inputs are not permitted"),
        (b'{"kind": "stop_task", "task_id": 7}', "Input should be a valid string"),
        (b"", "Invalid JSON"),
    ],
)
async def test_malformed_or_foreign_messages_are_logged_and_dropped(
    payload: bytes, problem: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with linked_buses(2) as (sender, receiver):
        messages = receiver.subscribe(KEY, WorkerCommandAdapter)
        await first_delivery(sender, messages)
        with caplog.at_level(logging.WARNING, logger="exo.cluster.bus"):
            sender.session.put(KEY, payload)
            sender.publish(KEY, StopTask(task_id=TaskId("after")))
            # The valid message after the bad one proves the bad one was dropped, not stuck or fatal.
            with anyio.fail_after(20):
                assert await messages.receive() == StopTask(task_id=TaskId("after"))
        assert receiver.dropped_messages == 1
        dropped = [record.getMessage() for record in caplog.records if "dropped" in record.getMessage()]
        assert dropped
        assert KEY in dropped[0]
        assert problem in dropped[0]


async def test_an_oversized_message_is_dropped_before_it_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bus_module, "MAX_MESSAGE_BYTES", 64)
    async with linked_buses(1) as (only,):
        messages = only.subscribe(KEY, WorkerCommandAdapter)
        only.publish(KEY, StopTask(task_id=TaskId("x" * 100)))
        only.publish(KEY, StopTask(task_id=TaskId("small")))
        with anyio.fail_after(20):
            assert await messages.receive() == StopTask(task_id=TaskId("small"))
        assert only.dropped_messages == 1


async def test_a_flood_of_bad_messages_logs_one_line_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    async with linked_buses(1) as (only,):
        only.subscribe(KEY, WorkerCommandAdapter)
        with caplog.at_level(logging.WARNING, logger="exo.cluster.bus"):
            for _ in range(50):
                only.session.put(KEY, b"garbage")
            await eventually(lambda: only.dropped_messages == 50)
        assert len([record for record in caplog.records if "dropped" in record.getMessage()]) == 1


async def test_queries_get_the_valid_answers_and_silence_is_an_empty_list() -> None:
    snapshot = StateSnapshot(leader=NODE_A, state=State(last_event_index=4))
    async with linked_buses(2) as (server, client):
        server.answer_queries("exo/test/v1/state", lambda: snapshot)
        client.answer_queries("exo/test/v1/other", lambda: None)
        await eventually(lambda: bool(client.session.info.peers_zid()))
        with anyio.fail_after(30):
            while not (answers := await client.query("exo/test/v1/state", StateSnapshotAdapter, timeout=2)):
                pass
        assert answers == [snapshot]
        assert await server.query("exo/test/v1/other", TypeAdapter(StateSnapshot), timeout=0.5) == []
