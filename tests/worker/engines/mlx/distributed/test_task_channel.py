"""Rank 0's task connections: followers introduce themselves, strangers are ignored, absence and loss are reported."""

import socket
import threading
from multiprocessing.connection import Connection

import pytest

from exo.shared.types.common import ModelId, new_command_id, new_task_id
from exo.shared.types.tasks import GenerationParams, GenerationTask, PromptMessage
from exo.worker.engines.mlx.distributed.task_channel import (
    BatchStep,
    FollowTask,
    PeerLostError,
    accept_followers,
    connect_to_leader,
    listen,
    receive_message,
    send_message,
)
from tests.ports import free_port


def _task() -> GenerationTask:
    return GenerationTask(
        task_id=new_task_id(),
        command_id=new_command_id(),
        model_id=ModelId("m"),
        params=GenerationParams(messages=(PromptMessage(role="user", content="hi"),)),
    )


def test_followers_connect_in_any_order_and_receive_the_whole_task() -> None:
    address = f"127.0.0.1:{free_port()}"
    server = listen(address)
    connected: dict[int, Connection] = {}

    def follower(rank: int) -> None:
        connected[rank] = connect_to_leader(address, rank, timeout=30)

    threads = [threading.Thread(target=follower, args=(rank,)) for rank in (2, 1)]
    for thread in threads:
        thread.start()
    followers = accept_followers(server, world_size=3, timeout=30)
    for thread in threads:
        thread.join()
    assert sorted(followers) == [1, 2]
    message = BatchStep(joins=(FollowTask(task=_task(), prompt_tokens=(1, 2, 3)),))
    for connection in followers.values():
        send_message(connection, message)
    assert [receive_message(connected[rank]) for rank in (1, 2)] == [message, message]
    followers[1].close()
    with pytest.raises(PeerLostError):
        receive_message(connected[1])
    for connection in [*followers.values(), *connected.values()]:
        connection.close()


def test_a_connection_that_does_not_introduce_itself_is_ignored_and_missing_ranks_are_named() -> None:
    address = f"127.0.0.1:{free_port()}"
    server = listen(address)
    stranger = socket.create_connection(("127.0.0.1", int(address.rsplit(":", 1)[1])))
    stranger.sendall(b"\x00\x00\x00\x05hello")
    with pytest.raises(TimeoutError, match=r"ranks \[1\] did not connect to rank 0 within 1 s"):
        accept_followers(server, world_size=2, timeout=1)
    stranger.close()


def test_a_follower_gives_up_on_a_leader_that_never_listens() -> None:
    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(TimeoutError, match=f"rank 0's task address {address} did not answer within 1 s"):
        connect_to_leader(address, rank=1, timeout=1)
