"""The decode rows of a pipeline's batch on one rank: which members, in which order, how many tokens each one's cache
holds, and their KV caches (this rank's layers only).

Every rank applies the same adds and removes in the same order (rank 0 lists them in each step), so the rows, and the
left padding mlx-lm's batch caches give them, are the same on every rank. One member decodes on its own plain cache;
a second merges both into mlx-lm's batch caches (`merge`, `extend`, `filter`, `extract`, as its `BatchGenerator`
does), and a batch down to one member goes back to a plain cache.

Each step the ranks check their rows against rank 0's list (`divergent_rows`, then `agree_on_divergence`): a member
some rank sees differently is dropped by every rank before the forward pass, and rank 0 fails it with an error.
"""

from collections.abc import Sequence
from typing import Protocol, cast

import mlx.core as mx
from mlx import nn
from mlx_lm.generate import generation_stream

from exo.shared.types.common import TaskId
from exo.worker.engines.mlx.cache.layer_cache import LayerCache, PromptCache
from exo.worker.engines.mlx.distributed.layer_split import stage_forward
from exo.worker.engines.mlx.distributed.task_channel import StepMember


class _BatchLayer(Protocol):
    """What mlx-lm's batch caches (BatchKVCache, BatchRotatingKVCache) offer here."""

    def extend(self, other: "_BatchLayer") -> None: ...

    def filter(self, batch_indices: mx.array) -> None: ...

    def extract(self, idx: int) -> LayerCache: ...


def _merged(caches: Sequence[PromptCache]) -> list[_BatchLayer]:
    """One batch cache per layer holding `caches` as rows, in order (mlx-lm's `merge` pads them on the left)."""
    layers: list[_BatchLayer] = []
    for index, layer in enumerate(caches[0]):
        merge = getattr(layer, "merge")  # noqa: B009 -- untyped mlx-lm classmethod
        layers.append(cast(_BatchLayer, merge([cache[index] for cache in caches])))
    return layers


class BatchRows:
    """The decoding members of this rank's batch, in step order."""

    def __init__(self) -> None:
        self.ids: list[TaskId] = []
        self.held: list[int] = []
        """Tokens each row's cache holds (its whole prompt while decoding, then one more per step)."""
        self._plain: PromptCache | None = None
        self._batch: list[_BatchLayer] | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, task_id: TaskId, cache: PromptCache, held: int) -> None:
        """A member joins the decode rows as the last row."""
        if not self.ids:
            self._plain = cache
        elif self._plain is not None:
            self._batch, self._plain = _merged([self._plain, cache]), None
        else:
            assert self._batch is not None
            for layer, joining in zip(self._batch, _merged([cache]), strict=True):
                layer.extend(joining)
        self.ids.append(task_id)
        self.held.append(held)

    def remove(self, task_id: TaskId) -> PromptCache:
        """Take a member out of the rows; its cache comes back as a plain one."""
        index = self.ids.index(task_id)
        removed = self._take(index)
        del self.ids[index]
        del self.held[index]
        return removed

    def keep_only(self, task_ids: Sequence[TaskId]) -> dict[TaskId, PromptCache]:
        """Remove every row not in `task_ids`; returns the removed rows' caches."""
        return {task_id: self.remove(task_id) for task_id in list(self.ids) if task_id not in task_ids}

    def _take(self, index: int) -> PromptCache:
        if self._plain is not None:
            removed, self._plain = self._plain, None
            return removed
        assert self._batch is not None
        removed = [layer.extract(index) for layer in self._batch]
        if len(self.ids) == 2:
            self._plain, self._batch = [layer.extract(1 - index) for layer in self._batch], None
            return removed
        kept = mx.array([row for row in range(len(self.ids)) if row != index])
        for layer in self._batch:
            layer.filter(kept)
        return removed

    def forward(self, model: nn.Module, tokens: Sequence[int], *, leader: bool) -> mx.array | None:
        """Feed one token to every row (in row order); rank 0 gets each row's logits, shape (rows, vocabulary)."""
        cache = cast(PromptCache, self._plain if self._plain is not None else self._batch)
        with mx.stream(generation_stream):
            output = stage_forward(model, mx.array(list(tokens))[:, None], cache, leader=leader)
            if not leader:
                mx.eval(output)
        self.held = [held + 1 for held in self.held]
        return output[:, -1, :] if leader else None


def divergent_rows(rows: BatchRows, members: Sequence[StepMember]) -> list[bool]:
    """For each of rank 0's rows, whether this rank's row at that place is another member or holds another number of
    tokens."""
    return [
        index >= len(rows) or (rows.ids[index], rows.held[index]) != (member.task_id, member.held)
        for index, member in enumerate(members)
    ]


def agree_on_divergence(group: mx.distributed.Group, flags: Sequence[bool]) -> list[bool]:
    """Every rank's flags together: what any rank found divergent (every rank passes the same number of flags)."""
    summed = mx.distributed.all_sum(mx.array([int(flag) for flag in flags], dtype=mx.int32), group=group, stream=mx.cpu)
    return [bool(count) for count in cast(list[int], summed.tolist())]
