"""A runner's place in its pipeline: the mlx.distributed ring, and the task connections (rank 0 holds one to every
other rank; every other rank holds one to rank 0).

Set up in three steps while the runner loads: rank 0 listens for task connections, every rank joins the ring, each
rank loads its layers, then the task connections are made. A rank is ready only once all of that is done, so a
pipeline that reports ready can run a task end to end.

In a keyed cluster every one of those sockets goes through the rank's TLS relay (pipeline_relay): the ring and the
task connections are made on loopback, to the relay, and only the relays' mutual-TLS connections cross the network.
"""

import logging
import socket
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from exo.shared.loopback_ports import free_loopback_port
from exo.shared.types.tls_link import TlsLinkConfig
from exo.shared.types.worker.shards import PipelinePeers, ShardAssignment
from exo.worker.runner.pipeline_relay import InboundTunnel, PipelineRelay, RelayPlan

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
    relay: PipelineRelay | None = None
    local_peers: PipelinePeers | None = None
    """The addresses this rank dials and binds: the placed ones, or its relay's loopback ports in a keyed cluster."""

    @property
    def peers(self) -> PipelinePeers:
        assert self.shard.peers is not None
        return self.shard.peers

    @property
    def is_leader(self) -> bool:
        return self.shard.rank == 0

    @classmethod
    def join(cls, shard: ShardAssignment, tls: TlsLinkConfig | None = None) -> "PipelineLink":
        """Listen for task connections (rank 0), then join the ring (`join_ring`: the process ends, or
        RingNotFormedError is raised, if it does not form in time).
        With `tls` (a keyed cluster), start this rank's TLS relay first and make every connection through it."""
        from exo.worker.engines.mlx.distributed.ring import join_ring
        from exo.worker.engines.mlx.distributed.task_channel import listen

        assert shard.peers is not None
        listener = listen(shard.peers.task_address if tls is None else "127.0.0.1:0") if shard.rank == 0 else None
        relay: PipelineRelay | None = None
        try:
            local_peers = shard.peers
            if tls is not None:
                relay, local_peers = _start_relay(shard, tls, listener)
            group = join_ring(shard.model_copy(update={"peers": local_peers}))
        except BaseException:
            if listener is not None:
                listener.close()
            if relay is not None:
                relay.close()
            raise
        return cls(shard=shard, group=group, _listener=listener, relay=relay, local_peers=local_peers)

    def connect_tasks(self, timeout: float = TASK_CONNECTION_TIMEOUT_SECONDS) -> None:
        """Make the task connections, once this rank has loaded its layers."""
        from exo.worker.engines.mlx.distributed.task_channel import accept_followers, connect_to_leader

        if self._listener is not None:
            listener, self._listener = self._listener, None
            self.connections = accept_followers(listener, self.shard.world_size, timeout)
        else:
            task_address = (self.local_peers or self.peers).task_address
            self.connections = {0: connect_to_leader(task_address, self.shard.rank, timeout)}
        logger.info("rank %d of %d: task connections made", self.shard.rank, self.shard.world_size)

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        for connection in self.connections.values():
            connection.close()
        if self.relay is not None:
            self.relay.close()


def _start_relay(
    shard: ShardAssignment, tls: TlsLinkConfig, task_listener: socket.socket | None
) -> tuple[PipelineRelay, PipelinePeers]:
    """Start this rank's relay, and return it with the addresses the rank uses instead of the placed ones.

    The ring backend listens at its own hostfile entry and dials only the next rank's: the relay accepts TLS at the
    placed ring address and hands it to the ring on a loopback port, and gives the ring a loopback port that reaches
    the next rank over TLS. Rank 0's task listener is on loopback behind the placed task address; the other ranks
    reach it through a loopback port of their relay."""
    peers = shard.peers
    assert peers is not None
    ring_port = free_loopback_port()
    next_rank = (shard.rank + 1) % shard.world_size
    inbound = [InboundTunnel(public=peers.ring_addresses[shard.rank], port=ring_port)]
    outbound = [peers.ring_addresses[next_rank]]
    if task_listener is not None:
        inbound.append(InboundTunnel(public=peers.task_address, port=task_listener.getsockname()[1]))
    else:
        outbound.append(peers.task_address)
    relay = PipelineRelay.start(RelayPlan(tls=tls, inbound=tuple(inbound), outbound=tuple(outbound)))
    ring = list(peers.ring_addresses)
    ring[shard.rank] = f"127.0.0.1:{ring_port}"
    ring[next_rank] = f"127.0.0.1:{relay.outbound_ports[0]}"
    task_address = f"127.0.0.1:{relay.outbound_ports[1]}" if task_listener is None else peers.task_address
    return relay, peers.model_copy(update={"ring_addresses": tuple(ring), "task_address": task_address})
