"""A runner's place in its pipeline: the mlx.distributed ring, and the task connections (rank 0 holds one to every
other rank; every other rank holds one to rank 0).

Set up in three steps while the runner loads: rank 0 listens for task connections, every rank joins the ring, each
rank loads its layers, then the task connections are made. A rank is ready only once all of that is done, so a
pipeline that reports ready can run a task end to end.
"""

import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, NoReturn

from exo.shared.types.worker.shards import PipelinePeers, ShardAssignment

if TYPE_CHECKING:
    import mlx.core as mx

logger = logging.getLogger(__name__)

TASK_CONNECTION_TIMEOUT_SECONDS = 300.0
"""How long ranks wait for each other to finish loading (their weights load at different speeds)."""


@dataclass
class PipelineLink:
    shard: ShardAssignment
    group: "mx.distributed.Group"
    _listener: socket.socket | None = None
    connections: dict[int, Connection] = field(default_factory=dict)
    """Task connections by the rank at the other end."""

    @property
    def peers(self) -> PipelinePeers:
        assert self.shard.peers is not None
        return self.shard.peers

    @property
    def is_leader(self) -> bool:
        return self.shard.rank == 0

    @classmethod
    def join(cls, shard: ShardAssignment, on_timeout: Callable[[str], NoReturn]) -> "PipelineLink":
        """Listen for task connections (rank 0), then join the ring; `on_timeout` ends the process if it never forms."""
        from exo.worker.engines.mlx.distributed.ring import join_ring
        from exo.worker.engines.mlx.distributed.task_channel import listen

        assert shard.peers is not None
        listener = listen(shard.peers.task_address) if shard.rank == 0 else None
        try:
            group = join_ring(shard, on_timeout)
        except BaseException:
            if listener is not None:
                listener.close()
            raise
        return cls(shard=shard, group=group, _listener=listener)

    def connect_tasks(self, timeout: float = TASK_CONNECTION_TIMEOUT_SECONDS) -> None:
        """Make the task connections, once this rank has loaded its layers."""
        from exo.worker.engines.mlx.distributed.task_channel import accept_followers, connect_to_leader

        if self._listener is not None:
            listener, self._listener = self._listener, None
            self.connections = accept_followers(listener, self.shard.world_size, timeout)
        else:
            self.connections = {0: connect_to_leader(self.peers.task_address, self.shard.rank, timeout)}
        logger.info("rank %d of %d: task connections made", self.shard.rank, self.shard.world_size)

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        for connection in self.connections.values():
            connection.close()
