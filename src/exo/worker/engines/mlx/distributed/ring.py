"""Joining the mlx.distributed ring of one pipeline instance.

The ring backend reads its peers from a hostfile (a JSON array of "ip:port" lists, indexed by rank) and the rank from
the environment, then blocks until every neighbour has connected. A rank whose peers never come would wait forever
(without using the CPU), so the join runs under a deadline.
"""

import json
import logging
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import mlx.core as mx

from exo.shared.types.worker.shards import PipelinePeers, ShardAssignment

logger = logging.getLogger(__name__)

RING_JOIN_TIMEOUT_SECONDS = 120.0


def hostfile_entries(peers: PipelinePeers) -> list[list[str]]:
    """The ring backend's hostfile: one list of addresses per rank."""
    return [[address] for address in peers.ring_addresses]


def join_ring(
    shard: ShardAssignment,
    on_timeout: Callable[[str], NoReturn],
    timeout: float = RING_JOIN_TIMEOUT_SECONDS,
) -> mx.distributed.Group:
    """Connect this rank to the others of its pipeline; `on_timeout(reason)` ends the process if they do not come.

    A group is formed once per process (mlx allows no second one), so a runner whose ring breaks must exit.
    """
    peers = shard.peers
    if peers is None:
        raise ValueError("only a pipeline shard joins a ring")
    with tempfile.TemporaryDirectory(prefix="exo-ring-") as folder:
        hostfile = Path(folder) / "hostfile.json"
        hostfile.write_text(json.dumps(hostfile_entries(peers)))
        os.environ["MLX_HOSTFILE"] = str(hostfile)
        os.environ["MLX_RANK"] = str(shard.rank)
        reason = (
            f"rank {shard.rank} of {shard.world_size}: the other ranks ({', '.join(peers.ring_addresses)}) did not "
            f"all join the ring within {timeout:.0f} s"
        )
        watchdog = threading.Timer(timeout, on_timeout, args=(reason,))
        watchdog.daemon = True
        watchdog.start()
        try:
            group = mx.distributed.init(strict=True, backend="ring")
            # Every rank is connected only once a collective has gone round the whole ring.
            mx.eval(mx.distributed.all_sum(mx.array(1), group=group, stream=mx.cpu))
        finally:
            watchdog.cancel()
    if (group.rank(), group.size()) != (shard.rank, shard.world_size):
        expected = f"{shard.rank} of {shard.world_size}"
        raise RuntimeError(f"joined as rank {group.rank()} of {group.size()}, expected {expected}")
    logger.info("rank %d of %d joined the ring at %s", shard.rank, shard.world_size, peers.ring_addresses[shard.rank])
    return group
