"""Continuous batching on mlx-lm's `BatchGenerator`: sequences join and leave a running batch between tokens.

mlx-lm does the batching itself: merging members' KV caches (left-padded), prefilling new prompts in chunks between
decode steps, one forward pass per step for every member, and per-member samplers and logits processors. This class
only maps requests to its sequence ids and leaves every decision (when a request ends, what its tokens mean) to the
request: the generator is given no stop tokens and one token more than the request may generate, so it never ends a
sequence on its own, and a member is always taken out with `remove`, which hands back its KV cache.
"""

import functools
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import ParamSpec, TypeVar

import mlx.core as mx
from mlx import nn
from mlx_lm.generate import BatchGenerator, PromptProcessingBatch, generation_stream

from exo.shared.types.common import TaskId
from exo.worker.engines.mlx.cache.layer_cache import PromptCache
from exo.worker.engines.mlx.generator.batch_step import JoinPrompts, LazyLogprobsBatch
from exo.worker.engines.mlx.generator.beside import AfterLaunch, launch
from exo.worker.engines.mlx.generator.processors import RequestProcessors
from exo.worker.engines.mlx.generator.sampling import Sampler
from exo.worker.engines.mlx.step_clock import STEP_CLOCK, StepPart

P = ParamSpec("P")
R = TypeVar("R")


class _MlxWithTimedEval(ModuleType):
    """`mlx.core` as mlx-lm's generate module sees it, with `eval` counted as waiting on the device: the
    `BatchGenerator` blocks in `mx.eval` for the tokens of the step it launched before, inside its own `next()`, and
    the host-overhead meter needs that wait apart from the Python work around it."""

    def __getattr__(self, name: str) -> object:
        return getattr(mx, name)

    @staticmethod
    def eval(*arrays: object) -> None:
        with STEP_CLOCK.part("device"):
            mx.eval(*arrays)  # pyright: ignore[reportArgumentType] -- passed through as mlx-lm gave them

    @staticmethod
    def async_eval(*arrays: object) -> None:
        launch(*arrays)  # pyright: ignore[reportArgumentType] -- passed through as mlx-lm gave them


# The module itself: `mlx_lm.generate` as an attribute is the package's `generate` function.
setattr(importlib.import_module("mlx_lm.generate"), "mx", _MlxWithTimedEval("mlx.core"))  # noqa: B010


def _join_step_timed_as(part: StepPart, method: Callable[P, R]) -> Callable[P, R]:
    """`method` of mlx-lm's prompt batch with its time counted for `part`, the waits and launches inside it still
    their own (parts nest exclusively)."""

    @functools.wraps(method)
    def timed(*args: P.args, **kwargs: P.kwargs) -> R:
        with STEP_CLOCK.part(part):
            return method(*args, **kwargs)

    return timed


# A joining member's first step is mlx-lm's own (`PromptProcessingBatch.generate`: its forward pass and sample built
# in Python, as `LazyLogprobsBatch._step` builds later steps), and any prompt tokens it still had are read by mlx-lm's
# `prompt` (model work, as exo's own prefill pieces): counted so, not left to the loop's remainder.
PromptProcessingBatch.generate = _join_step_timed_as("graph", PromptProcessingBatch.generate)
_read_prompts = PromptProcessingBatch.prompt
_read_prompts_timed = _join_step_timed_as("prefill", _read_prompts)


def _prompt(self: PromptProcessingBatch, tokens: list[list[int]]) -> None:
    # Called on every step, mostly with nothing to read: only a call with tokens is prefill work.
    (_read_prompts_timed if tokens else _read_prompts)(self, tokens)


PromptProcessingBatch.prompt = _prompt


@dataclass(frozen=True)
class BatchMember:
    """What the batch needs to decode one request."""

    task_id: TaskId
    sampler: Sampler
    processors: RequestProcessors
    max_tokens: int


@dataclass(frozen=True)
class RemovedMember:
    cache: PromptCache
    """The member's KV cache (the cached prefix, then `fed`)."""
    fed: list[int]
    """The tokens the cache holds after the cached prefix."""


class BatchDecoder:
    """The running batch of one model."""

    def __init__(
        self,
        model: nn.Module,
        *,
        batch_size: int,
        prefill_step_size: int,
        overlap: bool = False,
        read_ahead: Callable[[list[tuple[TaskId, int]]], AfterLaunch] | None = None,
    ) -> None:
        """`read_ahead`, where given, is called with each step's tokens (as `step` will return them) before that
        step's successor is launched: they can be accepted while it computes; what it returns is called once the launch
        returns (`beside.py`)."""
        self._generator = BatchGenerator(
            model,
            completion_batch_size=batch_size,
            prefill_batch_size=batch_size,
            prefill_step_size=prefill_step_size,
        )
        # The long-lived batch every member is merged into: stepped without evaluating log-probabilities, and with
        # `overlap` a step with a constrained member launched before its masks (`settle`).
        self._read_ahead = read_ahead
        self._batch = LazyLogprobsBatch.for_decoding(
            model,
            self._generator.sampler,
            overlap=overlap,
            read_ahead=self._tokens_read_ahead if read_ahead is not None else None,
        )
        self._generator._generation_batch = self._batch  # pyright: ignore[reportPrivateUsage]
        # The prompts being read, from which newcomers join: with `overlap`, a newcomer's first forward pass is
        # launched before its processors compute its first mask.
        self._prompts = JoinPrompts.for_joining(
            model, self._generator.sampler, prefill_step_size=prefill_step_size, overlap=overlap
        )
        self._generator._prompt_batch = self._prompts  # pyright: ignore[reportPrivateUsage]
        self._uids: dict[TaskId, int] = {}
        self._task_ids: dict[int, TaskId] = {}
        self._tokens_out: dict[int, int] = {}
        """Tokens mlx-lm's step returned per member (the first one repeats the token handed out when it joined)."""
        self._handed_early: dict[int, int] = {}
        """Members whose first token was handed out as they joined: the token mlx-lm's next step returns again."""

    def __len__(self) -> int:
        return len(self._uids)

    def __contains__(self, task_id: TaskId) -> bool:
        return task_id in self._uids

    def add(self, member: BatchMember, cache: PromptCache, *, fed: Sequence[int], pending: Sequence[int]) -> None:
        """Join the batch: `pending` is fed on top of `cache`, which holds the cached prefix and then `fed`."""
        processors = [] if member.processors.empty else [member.processors]
        (uid,) = self._generator.insert(
            [list(pending)],
            max_tokens=[member.max_tokens + 1],
            caches=[cache],
            all_tokens=[list(fed)],  # the generator appends to this list in place
            samplers=[member.sampler],
            logits_processors=[processors],
        )
        self._uids[member.task_id] = uid
        self._task_ids[uid] = member.task_id
        self._tokens_out[uid] = 0

    def step(self) -> list[tuple[TaskId, int]]:
        """One generation step (plus one prefill chunk for members still reading their prompts): each decoding
        member's next token. The members that joined in this step have theirs from `take_joined`."""
        _, responses = self._generator.next()
        stepped = [(response.uid, response.token) for response in responses]
        tokens = self._handed_out(stepped)
        for uid, token in stepped:
            self._tokens_out[uid] += 1
            early = self._handed_early.pop(uid, None)
            if early is not None and early != token:
                raise RuntimeError(f"batch member {uid} was handed {early} early but sampled {token}")
        return tokens

    def _handed_out(self, stepped: list[tuple[int, int]]) -> list[tuple[TaskId, int]]:
        """A step's (uid, token) pairs as the requests' tokens: a joined member's early token, which mlx-lm's next step
        returns again, left out."""
        return [(self._task_ids[uid], token) for uid, token in stepped if uid not in self._handed_early]

    def _tokens_read_ahead(self, uids: list[int], tokens: list[int]) -> AfterLaunch:
        """The tokens mlx-lm's step is about to return, as `step` will hand them out."""
        assert self._read_ahead is not None
        return self._read_ahead(self._handed_out(list(zip(uids, tokens, strict=True))))

    def take_joined(self) -> list[tuple[TaskId, int]]:
        """The first token of each member that joined in the last `step`, sampled by its joining pass: handing it out
        now saves a newcomer a whole batch step before its first token. Reading it waits for that pass (and, on the
        device's one stream, for the running members' pass launched before it): taken after `settle`, so the running
        members' tokens are accepted and their masks computed while both passes run."""
        tokens: list[tuple[TaskId, int]] = []
        for uid, token in self._batch.take_joined():
            if uid in self._task_ids:
                self._handed_early[uid] = token
                tokens.append((self._task_ids[uid], token))
        return tokens

    def settle(self) -> bool:
        """After the tokens of the last `step` were accepted and the members that ended or went back with them were
        removed: where that step launched its forward pass before its masks, feed the remaining members' grammars
        their tokens and launch the sample (the masks computed while the pass runs). False where nothing waited."""
        with mx.stream(generation_stream):
            return self._batch.settle()

    @property
    def constrained_joins(self) -> int:
        """Joins with a constrained newcomer whose first forward pass was launched before its first mask."""
        return self._prompts.launches.constrained

    def decoding(self, task_id: TaskId) -> bool:
        """Whether mlx-lm's step has returned a token for the member (its prompt is behind it, its cache ends at its
        last token handed out)."""
        return self._tokens_out[self._uids[task_id]] > 0

    def remove(self, task_id: TaskId) -> RemovedMember:
        """Take a member out of the batch with its cache."""
        uid = self._uids.pop(task_id)
        del self._task_ids[uid]
        del self._tokens_out[uid]
        self._handed_early.pop(uid, None)
        cache, tokens = self._generator.remove([uid], return_prompt_caches=True)[uid]
        return RemovedMember(cache=list(cache), fed=list(tokens))

    def close(self) -> None:
        self._generator.close()
