"""Joining the mlx.distributed ring of one pipeline instance.

The ring backend reads its peers from a hostfile (a JSON array of "ip:port" lists, indexed by rank) and the rank from
the environment, then blocks until every neighbour has connected, holding the GIL. A rank whose peers never come
would wait forever (without using the CPU), so the join runs under the kernel's deadline (`exo.worker.ring_deadline`:
SIGALRM ends the process) and mlx giving up earlier raises `RingNotFormedError`. A process so ended leaves its
hostfile's folder behind (a scratch folder named after the process, `exo.models.staging`): the next join on the
machine removes those of processes that are gone.
"""

import json
import logging
import os
import signal
import tempfile
import threading
from pathlib import Path

import mlx.core as mx

from exo.models.staging import scratch_directory
from exo.shared.types.worker.shards import PipelinePeers, ShardAssignment
from exo.worker.ring_deadline import RingNotFormedError, ring_join_timeout

logger = logging.getLogger(__name__)

HOSTFILE_SCRATCH_LABEL = "exo-ring"
"""The label of the hostfile's scratch folder in the temporary directory."""


def hostfile_entries(peers: PipelinePeers) -> list[list[str]]:
    """The ring backend's hostfile: one list of addresses per rank."""
    return [[address] for address in peers.ring_addresses]


def join_ring(shard: ShardAssignment, timeout: float | None = None) -> mx.distributed.Group:
    """Connect this rank to the others of its pipeline within `timeout` seconds (default `ring_join_timeout()`):
    past it the process ends (SIGALRM; only where this runs on the main thread, as a runner's load does), and mlx
    giving up first raises RingNotFormedError.

    A group is formed once per process (mlx allows no second one), so a runner whose ring breaks must exit.
    """
    peers = shard.peers
    if peers is None:
        raise ValueError("only a pipeline shard joins a ring")
    seconds = ring_join_timeout() if timeout is None else timeout
    on_main_thread = threading.current_thread() is threading.main_thread()
    with scratch_directory(Path(tempfile.gettempdir()), HOSTFILE_SCRATCH_LABEL) as folder:
        hostfile = folder / "hostfile.json"
        hostfile.write_text(json.dumps(hostfile_entries(peers)))
        os.environ["MLX_HOSTFILE"] = str(hostfile)
        os.environ["MLX_RANK"] = str(shard.rank)
        logger.info(
            "rank %d of %d joining the ring (%s); this runner ends if the others have not joined within %.0f s",
            shard.rank,
            shard.world_size,
            ", ".join(peers.ring_addresses),
            seconds,
        )
        if on_main_thread:
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            group = mx.distributed.init(strict=True, backend="ring")
            # Every rank is connected only once a collective has gone round the whole ring.
            mx.eval(mx.distributed.all_sum(mx.array(1), group=group, stream=mx.cpu))
        except RuntimeError as error:
            raise RingNotFormedError(
                f"rank {shard.rank} of {shard.world_size}: the other ranks ({', '.join(peers.ring_addresses)}) did "
                f"not all join the ring: {error}"
            ) from error
        finally:
            if on_main_thread:
                signal.setitimer(signal.ITIMER_REAL, 0)
    if (group.rank(), group.size()) != (shard.rank, shard.world_size):
        expected = f"{shard.rank} of {shard.world_size}"
        raise RuntimeError(f"joined as rank {group.rank()} of {group.size()}, expected {expected}")
    logger.info("rank %d of %d joined the ring at %s", shard.rank, shard.world_size, peers.ring_addresses[shard.rank])
    return group
