"""Run a function on every rank of a real mlx.distributed ring of local processes (127.0.0.1, free ports)."""

import multiprocessing
import queue
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from exo.shared.types.worker.shards import Parallelism, PipelinePeers, ShardAssignment, pipeline_shards
from tests.ports import free_port

if TYPE_CHECKING:
    import mlx.core as mx

RankFunction = Callable[[ShardAssignment, Path, "mx.distributed.Group"], object]
"""Runs inside a rank's process with its shard, the model directory and the ring; returns something picklable."""


def local_peers(layer_counts: Sequence[int], parallel: Parallelism = "pipeline") -> PipelinePeers:
    return PipelinePeers(
        ring_addresses=tuple(f"127.0.0.1:{free_port()}" for _ in layer_counts),
        task_address=f"127.0.0.1:{free_port()}",
        layer_counts=tuple(layer_counts),
        parallel=parallel,
    )


def _rank_main(
    function: RankFunction, shard: ShardAssignment, model_dir: Path, results: "queue.Queue[tuple[int, object]]"
) -> None:
    from exo.worker.engines.mlx.distributed.ring import join_ring

    group = join_ring(shard, timeout=60)
    results.put((shard.rank, function(shard, model_dir, group)))


def run_on_ranks(
    function: RankFunction, model_dir: Path, layer_counts: Sequence[int], timeout: float = 120
) -> list[object]:
    """`function`'s result on each rank, in rank order; every process is gone when this returns."""
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue[tuple[int, object]] = context.Queue()
    processes = [
        context.Process(target=_rank_main, args=(function, shard, model_dir, results), daemon=True)
        for shard in pipeline_shards(local_peers(layer_counts))
    ]
    for process in processes:
        process.start()
    try:
        collected: dict[int, object] = {}
        for _ in processes:
            rank, result = results.get(timeout=timeout)
            collected[rank] = result
        return [collected[rank] for rank in range(len(processes))]
    finally:
        for process in processes:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join()
