"""Ranks that disagree about a pipeline batch's members fail the affected requests with an error, never with wrong
text, and go on serving together.

Two real ranks on tiny-qwen-tools-deep: rank 0 is a `PipelineBatchLeader`, rank 1 a `PipelineBatchFollower` that loses
the step telling it a member left (as a rank whose view drifted would). At the next step its rows no longer match
rank 0's list: every rank drops the mismatched member, rank 0 fails it with an error, and a request admitted after
that decodes as it would have anyway.
"""

from pathlib import Path

import mlx.core as mx
from pydantic import JsonValue

from exo.shared.types.chunks import Chunk, ErrorChunk, FinishChunk, TokenChunk
from exo.shared.types.common import TaskId
from exo.shared.types.worker.decode_settings import DecodeSettings
from exo.shared.types.worker.shards import ShardAssignment
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

MAX_STEPS = 500


def _body(content: str, max_tokens: int) -> dict[str, JsonValue]:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "temperature": 0}


def _leader(shard: ShardAssignment, model_dir: Path, group: mx.distributed.Group) -> dict[str, list[Chunk]]:
    assert shard.peers is not None
    followers = accept_followers(listen(shard.peers.task_address), shard.world_size, timeout=60)
    context = context_for(load_model(model_dir, shard, group=group), DecodeSettings())
    leader = PipelineBatchLeader(context.loaded, followers)
    chunks: dict[TaskId, list[Chunk]] = {}

    def run(requests: list[ChatRequest]) -> None:
        for request in requests:
            chunks[request.task_id] = []
            leader.admit(request)
        for _ in range(MAX_STEPS):
            if not leader.busy:
                return
            for update in leader.step():
                chunks[update.task_id] += update.chunks
        raise AssertionError("the batch did not end")

    short, long = (ChatRequest.open(context, task(_body(text, n))) for text, n in (("Hello!", 3), ("Tell me", 30)))
    run([short, long])
    after = ChatRequest.open(context, task(_body("Hello!", 12)))
    alone = ChatRequest.open(context, task(_body("Hello!", 12)))
    run([after])
    run([alone])
    for connection in followers.values():
        send_message(connection, EndPipeline())
    assert leader.broken is None
    names = {short.task_id: "short", long.task_id: "long", after.task_id: "after", alone.task_id: "alone"}
    return {names[task_id]: answer for task_id, answer in chunks.items()}


def _follower_losing_a_leave(shard: ShardAssignment, model_dir: Path, group: mx.distributed.Group) -> int:
    assert shard.peers is not None
    connection = connect_to_leader(shard.peers.task_address, shard.rank, timeout=60)
    follower = PipelineBatchFollower(load_model(model_dir, shard, group=group), None)
    lost = 0
    while isinstance(message := receive_message(connection), BatchStep):
        if message.leaves and not lost:
            lost = len(message.leaves)
            message = message.model_copy(update={"leaves": ()})
        follower.apply(message)
    return lost


def _rank(shard: ShardAssignment, model_dir: Path, group: mx.distributed.Group) -> object:
    if shard.rank == 0:
        return _leader(shard, model_dir, group)
    return _follower_losing_a_leave(shard, model_dir, group)


def _text(chunks: list[Chunk]) -> str:
    return "".join(chunk.text for chunk in chunks if isinstance(chunk, TokenChunk))


def test_a_member_the_ranks_disagree_on_fails_with_an_error_and_the_batch_goes_on() -> None:
    leader, lost = run_on_ranks(_rank, FIXTURE_MODELS_DIR / "tiny-qwen-tools-deep", (3, 1), timeout=240)
    assert lost == 1  # the short request's leave never reached rank 1
    assert isinstance(leader, dict)
    answers: dict[str, list[Chunk]] = leader
    assert isinstance(answers["short"][-1], FinishChunk)
    error = answers["long"][-1]
    assert isinstance(error, ErrorChunk)
    assert "disagree" in error.message
    assert not any(isinstance(chunk, FinishChunk) for chunk in answers["long"])
    # The ranks are in step again: the next request decodes exactly as the same request does after it.
    assert isinstance(answers["after"][-1], FinishChunk)
    assert _text(answers["after"]) == _text(answers["alone"])
    assert answers["after"][-1] == answers["alone"][-1]
