"""How rank 0 hands each task to the other ranks of its pipeline: one TCP connection per follower.

Idle ranks wait here rather than inside a ring collective: the ring backend polls while it waits (about a fifth of a
core per idle rank, measured), a blocked socket read costs nothing. The connections also tell each side, while idle,
that the other is gone (end of file), and they carry the whole task, so every rank knows what it is computing.
"""

import logging
import socket
import time
from multiprocessing.connection import Connection
from typing import Annotated, Literal

from pydantic import Field, TypeAdapter, ValidationError

from exo.shared.types.common import FrozenModel, TaskId
from exo.shared.types.tasks import GenerationTask

logger = logging.getLogger(__name__)

CONNECT_RETRY_SECONDS = 0.2


class FollowTask(FrozenModel):
    """`task` joins the pipeline's batch: its prompt, as rank 0 rendered it, is `prompt_tokens`."""

    task: GenerationTask
    prompt_tokens: tuple[int, ...]


class Leave(FrozenModel):
    """A member left the batch (finished, cancelled or failed): `keep` says whether its cache fills the prefix cache
    (a failed member's cache may be half-written and is dropped)."""

    task_id: TaskId
    keep: bool


class StepMember(FrozenModel):
    """One row of a decode step: the member, how many tokens its cache holds before the step, and the token fed."""

    task_id: TaskId
    held: int
    token: int


class PrefillPiece(FrozenModel):
    """Feed the prompt tokens `start:start + length` of a member still reading its prompt."""

    task_id: TaskId
    start: int
    length: int


class BatchStep(FrozenModel):
    """One step of the pipeline's batch, applied by every rank in this order: members leave, tasks join (the ranks
    agree on each one's cached prefix), members that read their prompt enter the decode rows, every rank checks its
    own view of the rows and the piece against this message, then the piece and the decode step run."""

    kind: Literal["batch_step"] = "batch_step"
    leaves: tuple[Leave, ...] = ()
    joins: tuple[FollowTask, ...] = ()
    enters: tuple[TaskId, ...] = ()
    prefill: PrefillPiece | None = None
    members: tuple[StepMember, ...] = ()

    @property
    def checks(self) -> bool:
        """Whether the step runs anything (and so starts with the ranks' check of their views)."""
        return self.prefill is not None or bool(self.members)


class FollowerHello(FrozenModel):
    kind: Literal["follower_hello"] = "follower_hello"
    rank: int


class EndPipeline(FrozenModel):
    """Rank 0 is shutting down: the other ranks exit too."""

    kind: Literal["end_pipeline"] = "end_pipeline"


PipelineMessage = Annotated[BatchStep | FollowerHello | EndPipeline, Field(discriminator="kind")]
PipelineMessageAdapter: TypeAdapter[PipelineMessage] = TypeAdapter(PipelineMessage)


class PeerLostError(ConnectionError):
    """The other end of a task connection went away."""


class UnreadableMessageError(ValueError):
    """Something arrived on a task connection that is not a pipeline message."""


def send_message(connection: Connection, message: PipelineMessage) -> None:
    try:
        connection.send_bytes(PipelineMessageAdapter.dump_json(message))
    except OSError as error:
        raise PeerLostError(str(error)) from error


def receive_message(connection: Connection) -> PipelineMessage:
    try:
        payload = connection.recv_bytes()
    except (EOFError, OSError) as error:
        raise PeerLostError("the connection was closed") from error
    try:
        return PipelineMessageAdapter.validate_json(payload)
    except ValidationError as error:
        raise UnreadableMessageError(f"not a pipeline message: {error.errors()[0]['msg']}") from error


def _split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def listen(address: str) -> socket.socket:
    """Rank 0's listening socket, bound before the ring forms so followers find it once they have joined."""
    host, port = _split_address(address)
    return socket.create_server((host, port))


def accept_followers(server: socket.socket, world_size: int, timeout: float) -> dict[int, Connection]:
    """Wait for every other rank to connect and say which rank it is; raises TimeoutError naming the missing ranks."""
    followers: dict[int, Connection] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(followers) < world_size - 1:
            server.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                client, _ = server.accept()
            except TimeoutError:
                missing = sorted(set(range(1, world_size)) - followers.keys())
                raise TimeoutError(f"ranks {missing} did not connect to rank 0 within {timeout:.0f} s") from None
            client.settimeout(None)
            connection = Connection(client.detach())
            if not connection.poll(timeout):
                connection.close()
                continue
            try:
                hello = receive_message(connection)
            except (PeerLostError, UnreadableMessageError):
                hello = None
            if not isinstance(hello, FollowerHello) or not 0 < hello.rank < world_size or hello.rank in followers:
                logger.warning("ignoring a task connection that did not introduce itself as a new rank")
                connection.close()
                continue
            followers[hello.rank] = connection
    except BaseException:
        for connection in followers.values():
            connection.close()
        raise
    finally:
        server.close()
    return followers


def connect_to_leader(address: str, rank: int, timeout: float) -> Connection:
    """A follower's connection to rank 0 (retried until `timeout`: rank 0 may still be starting)."""
    host, port = _split_address(address)
    deadline = time.monotonic() + timeout
    while True:
        try:
            client = socket.create_connection((host, port), timeout=max(deadline - time.monotonic(), 0.01))
            break
        except OSError:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"rank 0's task address {address} did not answer within {timeout:.0f} s") from None
            time.sleep(CONNECT_RETRY_SECONDS)
    client.settimeout(None)
    connection = Connection(client.detach())
    send_message(connection, FollowerHello(rank=rank))
    return connection
