"""Prompt prefix cache: reuse the KV cache of the longest previously seen token prefix.

A coding agent resends its whole conversation every turn (system prompt, tool schemas, history), so most of each
prompt was already prefilled last turn. The storage, longest-prefix search, trimming and LRU/byte-budget eviction
are mlx-lm's own ``LRUPromptCache`` (the one ``mlx_lm.server`` uses); this module adds a typed lease protocol around
it, always leaves at least one prompt token to prefill (generation needs the last token's logits), and only stores
caches whose contents are verified to match the tokens they are filed under.

Memory is bounded by bytes alone (no count of entries): a new session of an agent shares its system prompt and tool
list with every earlier one, and finds it in whichever entry holds it. With a `DiskTier`, what is stored is also
queued as a snapshot on disk, and a prompt whose longest known prefix is on disk only (after a restart, or evicted
from memory) is served from there, unless this runner measured that prefilling the tokens the snapshot adds to
memory's match costs less than loading it (`LoadOrPrefill`).
"""

import dataclasses
import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from mlx import nn
from mlx_lm.models.cache import LRUPromptCache

from exo.shared.types.worker.runner_response import PrefixCacheUsage
from exo.worker.engines.mlx.cache.disk_tier import DiskMatch, DiskTier
from exo.worker.engines.mlx.cache.layer_cache import (
    PromptCache,
    can_trim,
    compact,
    held_token_count,
    materialize,
    new_prompt_cache,
    trim_tokens,
)
from exo.worker.engines.mlx.cache.load_or_prefill import LoadOrPrefill
from exo.worker.engines.mlx.step_clock import STEP_CLOCK

logger = logging.getLogger(__name__)

# LRUPromptCache can hold several models' caches keyed by a model handle; a PrefixCache serves exactly one model.
_MODEL_KEY = "model"
# The store is bounded by bytes alone; mlx-lm's entry count cannot be switched off, so it is set out of reach.
_UNBOUNDED_ENTRIES = 1 << 62


# A dataclass, not a pydantic model: the lease carries live, mutable MLX cache objects and never leaves the process.
@dataclass(frozen=True, eq=False)
class CacheLease:
    """A KV cache handed to one generation; give it back with ``release`` or ``discard``."""

    lease_id: int
    cache: PromptCache
    """Per-layer caches, owned by the caller until released; already holds the first ``cached_tokens`` tokens."""
    prompt_tokens: tuple[int, ...]
    cached_tokens: int
    """How many leading prompt tokens the cache already holds (their prefill is skipped)."""
    disk_cached_tokens: int = 0
    """How many of them were read from a snapshot on disk (0, or all of them)."""

    @property
    def remaining_tokens(self) -> list[int]:
        """The prompt tokens still to prefill: pass these as the generation prompt, with ``cache``."""
        return list(self.prompt_tokens[self.cached_tokens :])


class PrefixCache:
    """Keeps the KV caches of recent generations and leases out the best match for each new prompt.

    Not thread-safe: the runner's one generation thread leases and releases (several leases may be out at once,
    one per request in a batch).
    """

    def __init__(self, model: nn.Module, memory_budget_bytes: int, disk: DiskTier | None = None) -> None:
        if memory_budget_bytes < 0:
            raise ValueError("memory_budget_bytes must be >= 0")
        self._model = model
        self._store = LRUPromptCache(max_size=_UNBOUNDED_ENTRIES, max_bytes=memory_budget_bytes)
        self._disk = disk
        self._lease_ids = itertools.count()
        self._outstanding: set[int] = set()
        self.load_or_prefill = LoadOrPrefill()
        """This runner's measured costs of a snapshot's load and of the prefill it saves."""
        self.snapshots_loaded = 0
        self.snapshots_passed_over = 0
        """Disk snapshots holding more of a prompt than memory that were not loaded: prefilling the difference was
        measured to cost less, or, before both costs were measured, it was under 32 tokens."""

    def prefilled(self, tokens: int, seconds: float) -> None:
        """A prefill pass fed `tokens` in `seconds` of work: what a snapshot's load is weighed against."""
        self.load_or_prefill.prefilled(tokens, seconds)

    @property
    def nbytes(self) -> int:
        """Bytes held by stored caches (leased-out copies not included)."""
        return int(self._store.nbytes)

    @property
    def entries(self) -> int:
        """Number of stored caches."""
        return len(self._store)

    @property
    def disk(self) -> DiskTier | None:
        """The snapshots on disk (None without a disk tier)."""
        return self._disk

    @property
    def snapshots_pending(self) -> bool:
        """Disk snapshots are queued: write them with `write_pending_snapshot` while idle."""
        return self._disk is not None and self._disk.pending

    @property
    def disk_queued_bytes(self) -> int:
        """Bytes of KV held by the disk snapshots waiting to be written (0 without a disk tier)."""
        return self._disk.queued_bytes if self._disk is not None else 0

    def usage(self) -> PrefixCacheUsage:
        """What each tier holds now, for /metrics."""
        return PrefixCacheUsage(
            memory_bytes=self.nbytes,
            memory_entries=self.entries,
            queued_bytes=self.disk_queued_bytes,
            disk_bytes=self._disk.nbytes if self._disk is not None else 0,
            disk_entries=self._disk.entries if self._disk is not None else 0,
            snapshots_written=self._disk.written if self._disk is not None else 0,
            snapshots_dropped=self._disk.dropped_from_queue if self._disk is not None else 0,
            snapshots_loaded=self.snapshots_loaded,
            snapshots_passed_over=self.snapshots_passed_over,
            prefill_seconds_per_token=self.load_or_prefill.prefill_seconds_per_token,
            load_seconds_per_byte=self.load_or_prefill.load_seconds_per_byte,
        )

    def write_pending_snapshot(self, *, newest: bool = False) -> None:
        """Write the oldest (or `newest`) queued disk snapshot (seconds for a long prompt): off the path of any
        request."""
        if self._disk is not None:
            self._disk.write_pending(newest=newest)

    def acquire(self, prompt_tokens: Sequence[int]) -> CacheLease:
        """Lease a cache holding the longest stored prefix of ``prompt_tokens``, leaving at least one to prefill.

        The stored entry is copied, so whatever the generation does to the leased cache, the store stays intact.
        """
        prompt = list(prompt_tokens)
        if not prompt:
            raise ValueError("prompt_tokens must not be empty")
        cache, cached_tokens = self._fetch(prompt)
        disk_cached_tokens = 0
        if (from_disk := self._fetch_from_disk(prompt, better_than=cached_tokens)) is not None:
            cache, cached_tokens = from_disk
            disk_cached_tokens = cached_tokens
        lease = CacheLease(
            lease_id=next(self._lease_ids),
            cache=cache,
            prompt_tokens=tuple(prompt),
            cached_tokens=cached_tokens,
            disk_cached_tokens=disk_cached_tokens,
        )
        self._outstanding.add(lease.lease_id)
        return lease

    def release(self, lease: CacheLease, tokens: Sequence[int], cache: PromptCache | None = None) -> None:
        """Take back a leased cache that now holds KV for ``tokens`` (prompt + generated) and store it.

        ``cache`` is the cache the generation ended with when that is not the leased object itself (a batched
        generation hands back its member's copy, extracted from the batch's merged cache).

        The cache's own token count is checked against ``tokens``: a cache that ran ahead of the tokens the caller
        knows (mlx-lm's generator feeds each token to the model before yielding it) is trimmed back, one that holds
        fewer is filed under the tokens it really holds, and one that cannot be reconciled, or whose tokens do not
        begin with the leased prompt, is dropped. Storing evicts least recently stored entries down to the budget;
        an entry bigger than the whole budget is not kept.
        """
        self._end(lease)
        filled = lease.cache if cache is None else cache
        key = self._reconcile(lease, filled, list(tokens))
        if key is None:
            return
        compact(filled)
        # Waiting for the device: evaluating the cache also waits for the model's work queued before it (in a batch,
        # the next step launched before this member's end was seen); counted as host work, it was 0.1-0.15 ms of a
        # stand-in step at 8 streams (issue 36's meter).
        with STEP_CLOCK.part("device"):
            materialize(filled)
        self._store.insert_cache(_MODEL_KEY, key, filled)
        if self._disk is not None:
            self._disk.queue(key, filled)

    def discard(self, lease: CacheLease) -> None:
        """End a lease whose generation failed or was cancelled: its cache is dropped, the store is untouched."""
        self._end(lease)

    def shorten(self, lease: CacheLease, cached_tokens: int) -> CacheLease:
        """The same lease holding only its first `cached_tokens` tokens (the ranks of a pipeline reuse only the
        prefix every rank holds). Raises ValueError for a cache that cannot drop tokens."""
        excess = lease.cached_tokens - cached_tokens
        if excess < 0:
            raise ValueError(f"a lease holding {lease.cached_tokens} tokens cannot grow to {cached_tokens}")
        if excess == 0:
            return lease
        if cached_tokens == 0:
            cache = new_prompt_cache(self._model)
        elif not can_trim(lease.cache) or trim_tokens(lease.cache, excess) != excess:
            raise ValueError(f"the leased cache cannot drop its last {excess} tokens")
        else:
            cache = lease.cache
        disk_cached_tokens = min(lease.disk_cached_tokens, cached_tokens)
        return dataclasses.replace(
            lease, cache=cache, cached_tokens=cached_tokens, disk_cached_tokens=disk_cached_tokens
        )

    def _fetch(self, prompt: list[int]) -> tuple[PromptCache, int]:
        cache, rest = self._store.fetch_nearest_cache(_MODEL_KEY, prompt)
        if cache is None:
            return new_prompt_cache(self._model), 0
        leased: PromptCache = list(cache)
        cached_tokens = len(prompt) - len(rest)
        if cached_tokens < len(prompt):
            return leased, cached_tokens
        # An exact match holds the whole prompt, but generation needs the last token's logits: give one back.
        if can_trim(leased) and trim_tokens(leased, 1) == 1:
            return leased, cached_tokens - 1
        return new_prompt_cache(self._model), 0

    def _fetch_from_disk(self, prompt: list[int], better_than: int) -> tuple[PromptCache, int] | None:
        """A snapshot's cache cut to the prefix it shares with `prompt`, when that beats memory's `better_than`."""
        if self._disk is None or (match := self._disk.best_match(prompt)) is None:
            return None
        usable = min(match.common_tokens, len(prompt) - 1)
        if usable <= better_than or not self._worth_loading(match, saved_tokens=usable - better_than):
            return None
        started = time.perf_counter()
        loaded = self._disk.load(match.key)
        if loaded is None:
            return None
        cache, held = loaded
        materialize(cache)  # mlx reads lazily: the read belongs to the load's measured cost, not the first pass's
        self.load_or_prefill.loaded(match.nbytes, time.perf_counter() - started)
        excess = len(held) - usable
        if excess and (not can_trim(cache) or trim_tokens(cache, excess) != excess):
            return None
        self.snapshots_loaded += 1
        return cache, usable

    def _worth_loading(self, match: DiskMatch, saved_tokens: int) -> bool:
        worth, estimate = self.load_or_prefill.worth_loading(saved_tokens, match.nbytes)
        if worth:
            return True
        self.snapshots_passed_over += 1
        why = (
            "costs not measured yet"
            if estimate is None
            else f"about {estimate.prefill_seconds:.3f} s against {estimate.load_seconds:.3f} s to load"
        )
        logger.info(
            "prefix cache: prefilling %d tokens instead of loading a %.1f MB disk snapshot (%s)",
            saved_tokens,
            match.nbytes / 1e6,
            why,
        )
        return False

    def _reconcile(self, lease: CacheLease, cache: PromptCache, tokens: list[int]) -> list[int] | None:
        """The tokens ``cache`` verifiably holds, after trimming any excess; None if it cannot be trusted."""
        held = held_token_count(cache)
        if held is None or held == 0:
            return None
        if held > len(tokens):
            excess = held - len(tokens)
            if not can_trim(cache) or trim_tokens(cache, excess) != excess:
                return None
            held = len(tokens)
        key = tokens[:held]
        if not key:
            return None
        shared = min(len(key), len(lease.prompt_tokens))
        if tuple(key[:shared]) != lease.prompt_tokens[:shared]:
            return None
        return key

    def _end(self, lease: CacheLease) -> None:
        if lease.lease_id not in self._outstanding:
            raise ValueError(f"lease {lease.lease_id} is not outstanding (already released or discarded)")
        self._outstanding.remove(lease.lease_id)
