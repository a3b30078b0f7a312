"""Rank 0 decoding one chat request over its pipeline: the request's own semantics (`ChatRequest`: prompt, prefix
cache lease, processors, sampler, stop sequences, tool-call parser, finish) driven by a decoder whose every forward
pass runs through all the ranks.

For each request, rank 0 first hands the whole task, with the prompt it rendered, to every other rank; the ranks
agree on the cached prefix they all hold and prefill the rest together. Then each step: every rank runs its layers,
rank 0 alone processes the logits and chooses the token (grammar mask, penalties, sampler), feeds it to the request,
and shares the token with whether the request goes on. The pipeline runs one request at a time (no batching).

Any error other than a request's own (a processor failing, which ends that request normally) leaves the other ranks
at an unknown point of the protocol: the pipeline is then broken, and the runner must exit after reporting it.
"""

import logging
from collections.abc import Callable, Iterator, Mapping
from multiprocessing.connection import Connection
from typing import cast

import mlx.core as mx

from exo.shared.types.chunks import Chunk, ErrorChunk
from exo.worker.engines.mlx.distributed.lockstep import (
    StepOutcome,
    agree_on_cached_tokens,
    forward_last,
    prefill,
    share_step,
)
from exo.worker.engines.mlx.distributed.task_channel import FollowTask, send_message
from exo.worker.engines.mlx.generator.chat_completion import ChatRequest
from exo.worker.engines.mlx.utils_mlx import LoadedModel

logger = logging.getLogger(__name__)


class PipelineBrokenError(RuntimeError):
    """A rank stopped answering (or the ranks fell out of step): this runner cannot run another task."""


class PipelineLeader:
    """Rank 0 of a pipeline: runs requests one at a time over every rank."""

    def __init__(
        self, loaded: LoadedModel, followers: Mapping[int, Connection], *, prefill_step_size: int = 512
    ) -> None:
        if loaded.group is None:
            raise ValueError("a pipeline leader needs its ring")
        self._loaded = loaded
        self._group = loaded.group
        self._followers = dict(followers)
        self._prefill_step_size = prefill_step_size
        self.broken: str | None = None
        """Why the pipeline can no longer run tasks (None while it can)."""

    def run(self, request: ChatRequest, should_cancel: Callable[[], bool]) -> Iterator[Chunk]:
        """Decode `request` and yield its chunks; the last is its Finish or Error chunk (none if cancelled)."""
        if self.broken is not None:
            raise PipelineBrokenError(self.broken)
        try:
            yield from self._decode(request, should_cancel)
        except Exception as error:
            self.broken = f"{type(error).__name__}: {error}"
            logger.error("pipeline broken during task %s: %s", request.task_id, self.broken)
            request.fail(error)
            yield ErrorChunk(
                error="runner_crashed",
                message=f"a rank of this model's pipeline stopped answering ({self.broken}); the pipeline is being "
                "restarted",
            )

    def _decode(self, request: ChatRequest, should_cancel: Callable[[], bool]) -> Iterator[Chunk]:
        announcement = FollowTask(task=request.task, prompt_tokens=tuple(request.prompt_tokens))
        for connection in self._followers.values():
            send_message(connection, announcement)
        request.limit_cached_tokens(agree_on_cached_tokens(self._group, request.cached_tokens))
        yield request.prefill_progress(request.cached_tokens)
        model = self._loaded.model
        cache = request.take_cache()
        prompt_rest = request.prefill_tokens
        prefill(model, cache, prompt_rest[:-1], self._prefill_step_size)
        fed = prompt_rest[:-1]
        pending = prompt_rest[-1:]
        while True:
            logits = forward_last(model, cache, pending, leader=True)
            assert logits is not None
            fed += pending
            token = self._choose(request, fed, logits)
            chunks = request.accept([token])
            if request.processors.error is not None:
                outcome = StepOutcome.FAILED
            elif request.finished:
                outcome = StepOutcome.FINISHED
            elif should_cancel():
                outcome = StepOutcome.CANCELLED
            else:
                outcome = StepOutcome.CONTINUE
            share_step(self._group, (token, outcome))
            yield from chunks
            if outcome != StepOutcome.CONTINUE:
                break
            pending = [token]
        match outcome:
            case StepOutcome.FINISHED:
                yield from request.finish(cache)
            case StepOutcome.CANCELLED:
                request.cancel(cache)
            case _:
                assert request.processors.error is not None
                yield request.fail(request.processors.error)

    @staticmethod
    def _choose(request: ChatRequest, fed: list[int], logits: mx.array) -> int:
        """Rank 0's token: processors (penalties, then the grammar) over every token fed so far, then the sampler."""
        if not request.processors.empty:
            logits = request.processors(mx.array(fed), logits)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        (token,) = cast(list[int], request.sampler(logprobs).tolist())
        return token
