"""Every rank of a pipeline tells its own prefix cache what each prefill piece cost, so each rank weighs a disk
snapshot's load against the prefill it saves (`LoadOrPrefill`) as a single runner does.

Two real ranks on tiny-qwen-tools-deep: rank 0 a `PipelineBatchLeader`, rank 1 a `PipelineBatchFollower`, each with a
prefix cache; one request whose prompt is read in a piece long enough to be measured.
"""

from pathlib import Path

import mlx.core as mx
from pydantic import JsonValue

from exo.shared.types.chunks import FinishChunk
from exo.shared.types.worker.decode_settings import DecodeSettings
from exo.shared.types.worker.shards import ShardAssignment
from exo.worker.engines.mlx.cache.load_or_prefill import MEASURED_PIECE_TOKENS
from exo.worker.engines.mlx.cache.prefix_cache import PrefixCache
from exo.worker.engines.mlx.distributed.batch_follower import PipelineBatchFollower
from exo.worker.engines.mlx.distributed.batch_leader import PipelineBatchLeader
from exo.worker.engines.mlx.distributed.task_channel import (
    BatchStep,
    EndPipeline,
    accept_followers,
    connect_to_leader,
    listen,
    receive_message,
    send_message,
)
from exo.worker.engines.mlx.generator.chat_completion import ChatRequest
from exo.worker.engines.mlx.model_loader import load_model
from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR
from tests.worker.engines.mlx.distributed.ranks import run_on_ranks
from tests.worker.engines.mlx.generator.scheduling import context_for, task

BUDGET = 1 << 26
BODY: dict[str, JsonValue] = {
    "messages": [{"role": "user", "content": "tell me about the weather " * 20}],
    "max_tokens": 3,
    "temperature": 0,
}


def _leader(shard: ShardAssignment, model_dir: Path, group: mx.distributed.Group) -> tuple[float | None, int, bool]:
    assert shard.peers is not None
    followers = accept_followers(listen(shard.peers.task_address), shard.world_size, timeout=60)
    context = context_for(load_model(model_dir, shard, group=group), DecodeSettings(), prefix_cache_bytes=BUDGET)
    leader = PipelineBatchLeader(context.loaded, followers, prefix_cache=context.prefix_cache)
    request = ChatRequest.open(context, task(BODY))
    leader.admit(request)
    finished = False
    for _ in range(200):
        if not leader.busy:
            break
        for update in leader.step():
            finished = finished or any(isinstance(chunk, FinishChunk) for chunk in update.chunks)
    for connection in followers.values():
        send_message(connection, EndPipeline())
    assert context.prefix_cache is not None
    return context.prefix_cache.load_or_prefill.prefill_seconds_per_token, len(request.prompt_tokens), finished


def _follower(shard: ShardAssignment, model_dir: Path, group: mx.distributed.Group) -> float | None:
    assert shard.peers is not None
    connection = connect_to_leader(shard.peers.task_address, shard.rank, timeout=60)
    loaded = load_model(model_dir, shard, group=group)
    prefix_cache = PrefixCache(loaded.model, BUDGET)
    follower = PipelineBatchFollower(loaded, prefix_cache)
    while isinstance(message := receive_message(connection), BatchStep):
        follower.apply(message)
    return prefix_cache.load_or_prefill.prefill_seconds_per_token


def _rank(shard: ShardAssignment, model_dir: Path, group: mx.distributed.Group) -> object:
    return _leader(shard, model_dir, group) if shard.rank == 0 else _follower(shard, model_dir, group)


def test_each_rank_measures_the_prefill_its_prefix_cache_weighs_loads_against() -> None:
    leader, follower = run_on_ranks(_rank, FIXTURE_MODELS_DIR / "tiny-qwen-tools-deep", (3, 1), timeout=240)
    assert isinstance(leader, tuple)
    leader_seconds, prompt_tokens, finished = leader
    assert finished
    assert prompt_tokens > MEASURED_PIECE_TOKENS + 1  # read in a piece long enough to be measured
    for seconds in (leader_seconds, follower):
        assert isinstance(seconds, float)
        assert 0 < seconds < 1
