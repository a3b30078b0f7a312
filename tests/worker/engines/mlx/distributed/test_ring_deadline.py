"""A rank whose ring never forms ends within its deadline, though mlx waits holding the GIL (`ring_deadline.py`).

Measured before this deadline: a rank 0 alone waited in mlx's `accept` with no other Python thread running (a Python
timer never fired), so a pipeline whose other rank never came kept its runner, and its requests, waiting for good.
"""

import multiprocessing
import signal
import tempfile
import time
from pathlib import Path

import pytest

from exo.models.staging import STAGING_PREFIX, scratch_directory
from exo.shared.types.worker.shards import ShardAssignment, pipeline_shards
from exo.worker.engines.mlx.distributed.ring import HOSTFILE_SCRATCH_LABEL
from exo.worker.ring_deadline import (
    RING_JOIN_TIMEOUT_SECONDS,
    RING_JOIN_TIMEOUT_VARIABLE,
    RING_NOT_FORMED_EXIT_CODE,
    ended_waiting_for_ring,
    ring_join_timeout,
)
from tests.worker.engines.mlx.distributed.ranks import local_peers

DEADLINE = 2.0


def _join_alone(shard: ShardAssignment) -> None:
    from exo.worker.engines.mlx.distributed.ring import join_ring

    join_ring(shard, timeout=DEADLINE)


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_alone_ends_at_its_deadline_by_the_kernels_alarm(rank: int) -> None:
    shard = list(pipeline_shards(local_peers((2, 2))))[rank]
    process = multiprocessing.get_context("spawn").Process(target=_join_alone, args=(shard,))
    started = time.monotonic()
    process.start()
    process.join(timeout=60)
    elapsed = time.monotonic() - started
    if process.is_alive():
        process.kill()
    assert process.exitcode == -signal.SIGALRM, process.exitcode
    assert ended_waiting_for_ring(process.exitcode)
    assert DEADLINE <= elapsed < 30  # the deadline from the join, after the child's imports
    # Ended inside mlx, it left its hostfile's folder; the next join on the machine removes it, and no other.
    (left,) = _hostfile_folders(process.pid)
    with scratch_directory(Path(tempfile.gettempdir()), HOSTFILE_SCRATCH_LABEL) as live:
        assert not left.exists()
        assert live.exists()


def _hostfile_folders(pid: int | None) -> list[Path]:
    return list(Path(tempfile.gettempdir()).glob(f"{STAGING_PREFIX}{HOSTFILE_SCRATCH_LABEL}-{pid}-*"))


def test_the_deadline_is_read_from_the_environment_and_a_bad_one_refused() -> None:
    assert ring_join_timeout({}) == RING_JOIN_TIMEOUT_SECONDS
    assert ring_join_timeout({RING_JOIN_TIMEOUT_VARIABLE: " 7.5 "}) == 7.5
    for bad in ("soon", "0", "-3"):
        with pytest.raises(ValueError, match=RING_JOIN_TIMEOUT_VARIABLE):
            ring_join_timeout({RING_JOIN_TIMEOUT_VARIABLE: bad})


def test_only_the_rings_exits_count_as_waiting_for_it() -> None:
    assert ended_waiting_for_ring(RING_NOT_FORMED_EXIT_CODE)
    assert ended_waiting_for_ring(-signal.SIGALRM)
    for other in (None, 0, 1, -signal.SIGKILL, -signal.SIGSEGV):
        assert not ended_waiting_for_ring(other)
