"""A rank other than 0 in its pipeline's batch: it applies each `BatchStep` rank 0 sends, feeding the tokens rank 0
chose through its layers.

It parses nothing and emits nothing. Its prefix cache is its own (it holds only this rank's layers): a joining
request leases what it holds, the ranks agree on how much of the prompt every one of them holds, and a member that
leaves files its cache there again.

Before each step's forward passes it checks rank 0's rows and prefill piece against its own view (which member, how
many tokens its cache holds) and the ranks sum what they found: a member any rank sees otherwise is dropped by all.
A follower that cannot go on must not stay alive (rank 0 would wait for it on the ring forever): any other error
propagates and ends the process, which breaks the ring and fails every member on rank 0 with an error.
"""

import logging
from dataclasses import dataclass

from exo.shared.types.common import TaskId
from exo.worker.engines.mlx.cache.layer_cache import PromptCache, new_prompt_cache
from exo.worker.engines.mlx.cache.prefix_cache import CacheLease, PrefixCache
from exo.worker.engines.mlx.distributed.batch_rows import BatchRows, agree_on_divergence, divergent_rows
from exo.worker.engines.mlx.distributed.lockstep import agree_on_cached_tokens, prefill
from exo.worker.engines.mlx.distributed.task_channel import BatchStep, FollowTask, PrefillPiece
from exo.worker.engines.mlx.loaded_model import LoadedModel

logger = logging.getLogger(__name__)


@dataclass
class _Member:
    prompt: list[int]
    lease: CacheLease | None
    held: list[int]
    """The tokens this rank's cache of the member holds, in order."""
    cache: PromptCache | None
    """While the member reads its prompt; None once it is a decode row."""


class PipelineBatchFollower:
    """This rank's view of the batch: every member's prompt and held tokens, and the decode rows."""

    def __init__(self, loaded: LoadedModel, prefix_cache: PrefixCache | None) -> None:
        if loaded.group is None:
            raise ValueError("only a pipeline rank follows a batch")
        self._loaded = loaded
        self._group = loaded.group
        self._prefix_cache = prefix_cache
        self._members: dict[TaskId, _Member] = {}
        self._rows = BatchRows()

    @property
    def active(self) -> int:
        return len(self._members)

    def apply(self, step: BatchStep) -> None:
        """Run this rank's part of `step`."""
        for leave in step.leaves:
            self._leave(leave.task_id, keep=leave.keep)
        for join in step.joins:
            self._join(join)
        for task_id in step.enters:
            self._enter(task_id)
        if not step.checks:
            return
        flags = [*divergent_rows(self._rows, step.members), self._piece_diverges(step.prefill)]
        diverged = agree_on_divergence(self._group, flags)
        if any(diverged):
            logger.error("the ranks disagree on %d members of the batch: dropping them", sum(diverged))
        agreed = [member for member, flagged in zip(step.members, diverged, strict=False) if not flagged]
        for task_id, cache in self._rows.keep_only([member.task_id for member in agreed]).items():
            self._forget(task_id, cache, keep=False)
        if step.prefill is not None:
            if diverged[-1]:
                self._leave(step.prefill.task_id, keep=False)
            else:
                self._prefill(step.prefill)
        if agreed:
            self._rows.forward(self._loaded.model, [member.token for member in agreed], leader=False)
            for member in agreed:
                self._members[member.task_id].held.append(member.token)

    def _join(self, join: FollowTask) -> None:
        prompt = list(join.prompt_tokens)
        lease = self._prefix_cache.acquire(prompt) if self._prefix_cache is not None else None
        agreed = agree_on_cached_tokens(self._group, lease.cached_tokens if lease else 0)
        if lease is not None and self._prefix_cache is not None:
            lease = self._prefix_cache.shorten(lease, agreed)
        if join.task.task_id in self._members:
            logger.error("task %s joined twice: dropping the first", join.task.task_id)
            self._leave(join.task.task_id, keep=False)
        cache = lease.cache if lease is not None else new_prompt_cache(self._loaded.model)
        self._members[join.task.task_id] = _Member(prompt=prompt, lease=lease, held=prompt[:agreed], cache=cache)

    def _enter(self, task_id: TaskId) -> None:
        member = self._members.get(task_id)
        if member is None or member.cache is None:
            logger.error("task %s starts decoding but is not reading its prompt here", task_id)
            return  # its row is missing here: the check that follows finds it
        self._rows.add(task_id, member.cache, len(member.held))
        member.cache = None

    def _piece_diverges(self, piece: PrefillPiece | None) -> bool:
        if piece is None:
            return False
        member = self._members.get(piece.task_id)
        if member is None or member.cache is None:
            return True
        return len(member.held) != piece.start or piece.start + piece.length >= len(member.prompt)

    def _prefill(self, piece: PrefillPiece) -> None:
        member = self._members[piece.task_id]
        assert member.cache is not None
        tokens = member.prompt[piece.start : piece.start + piece.length]
        prefill(self._loaded.model, member.cache, tokens, max(len(tokens), 1), prefix_cache=self._prefix_cache)
        member.held += tokens

    def _leave(self, task_id: TaskId, *, keep: bool) -> None:
        member = self._members.get(task_id)
        if member is None:
            return  # dropped here already (the ranks disagreed on it)
        cache = member.cache if member.cache is not None else self._rows.remove(task_id)
        self._forget(task_id, cache, keep=keep)

    def _forget(self, task_id: TaskId, cache: PromptCache, *, keep: bool) -> None:
        member = self._members.pop(task_id, None)
        if member is None or member.lease is None or self._prefix_cache is None:
            return
        if keep:
            self._prefix_cache.release(member.lease, member.held, cache=cache)
        else:
            self._prefix_cache.discard(member.lease)
