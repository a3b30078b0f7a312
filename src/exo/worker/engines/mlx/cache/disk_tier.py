"""KV snapshots of prompt prefixes on disk, so a restarted node still skips the prefill of a known system prompt.

Each snapshot is two files in the model's own directory: `<key>.safetensors` (mlx-lm's `save_prompt_cache` format)
and `<key>.json` (a `SnapshotRecord`: the model identity, the tokens it holds, its size and sha256). A file whose
checksum, size, model identity or layer layout does not match is deleted with a warning and never loaded, so a
corrupt, truncated or foreign snapshot costs a prefill, not wrong output. So is an entry that is not a regular file
(a directory, a link, a pipe: read, a pipe would block the runner) or cannot be read: whatever is found under a
snapshot's name, the tier removes it or, when even that fails, leaves it alone and never tries to read it again in
this process. The directory is bounded by bytes, least recently used snapshots evicted first.

Writes are queued by the generation and done by `write_pending` while the runner is idle, after the response went out
(a queued snapshot that a later one extends, as an agent session's next turn does, is replaced unwritten). A queued
snapshot holds its KV cache in memory until it is written, and a runner under steady load is never idle: the queue is
bounded by bytes (`queue_budget_bytes`), its oldest snapshots dropped first (unwritten, as if they had been evicted),
so a node that serves for hours without a pause does not grow until it runs out of memory. Before it drops any, the
queue is drained beside generation: once it holds more than `write_beside_above_bytes`, its oldest snapshot's files
are written by a thread of the tier's own while generation goes on (one at a time; mlx and hashlib release the
interpreter's lock while they write and hash); the tier's bookkeeping stays on the runner's thread, which lands a
finished write at its next `queue` or `write_pending`. Only caches whose every layer is a plain, evaluated KV cache go
to the thread (their state is their buffers, no mlx work is left to run there). Writing beside generation only under
that pressure leaves a runner with idle moments as it was, with no extra writes (docs/OPERATIONS.md, the soak, has
both measured under steady load).
"""

import hashlib
import logging
import shutil
import stat
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, TypeAlias

import numpy as np
import numpy.typing as npt
from mlx import nn
from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache
from pydantic import Field

from exo.shared.types.common import FrozenModel
from exo.worker.engines.mlx.cache.layer_cache import PromptCache, held_token_count, new_prompt_cache
from exo.worker.engines.mlx.cache.owned_kv_cache import is_plain_kv_cache

logger = logging.getLogger(__name__)

TokenArray: TypeAlias = npt.NDArray[np.int32]
TokenId = Annotated[int, Field(ge=0, lt=2**31)]
"""A token id as a snapshot's record holds it: a record with any other number is not one of ours (and would not fit
the int32 arrays prompts are compared in)."""

MIN_SNAPSHOT_TOKENS = 256
"""Shorter prompts prefill in well under a second anywhere: not worth a file."""
_HASH_BLOCK = 1 << 20
_MAX_RECORD_BYTES = 64 << 20
"""A sidecar holds one token list: even a million-token prompt's is a few MB. A larger one is not ours."""
_KIND_NAMES = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


class SnapshotRecord(FrozenModel):
    """What a snapshot's sidecar file says about it."""

    model_identity: str
    tokens: tuple[TokenId, ...]
    nbytes: int
    """The size of the safetensors file."""
    sha256: str
    """Of the safetensors file's bytes."""
    layer_types: tuple[str, ...]
    """The class of each layer's cache, as mlx-lm names it."""


@dataclass
class _Entry:
    key: str
    record: SnapshotRecord
    last_used: float
    # The record's tokens as an array: every request compares its prompt with each snapshot's (`best_match`).
    token_array: TokenArray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.token_array = np.asarray(self.record.tokens, dtype=np.int32)


@dataclass(frozen=True)
class DiskMatch:
    """The snapshot sharing the longest prefix with a prompt."""

    key: str
    common_tokens: int
    nbytes: int
    """The snapshot file's size: what a load reads and checks, however few of its tokens are used."""


@dataclass(frozen=True)
class _Pending:
    tokens: tuple[int, ...]
    cache: PromptCache
    nbytes: int
    """The cache's KV bytes when queued: a queued cache is never extended (the memory tier leases out copies)."""


@dataclass(frozen=True)
class _InFlight:
    """A snapshot whose files the writer thread is writing."""

    key: str
    pending: _Pending
    done: "Future[SnapshotRecord | None]"


class DiskTier:
    """The snapshots of one model (one rank's layers of it, on a split model) in `directory`, within `budget_bytes`."""

    def __init__(
        self,
        directory: Path,
        budget_bytes: int,
        model_identity: str,
        model: nn.Module,
        *,
        queue_budget_bytes: int,
        write_beside_above_bytes: int | None = None,
    ) -> None:
        if budget_bytes <= 0:
            raise ValueError("a disk tier needs a positive byte budget")
        self._directory = directory
        self._budget = budget_bytes
        self._queue_budget = queue_budget_bytes
        """Bytes of KV the snapshots waiting to be written may hold in memory."""
        self.dropped_from_queue = 0
        """Snapshots dropped unwritten because the queue was over its budget."""
        self._identity = model_identity
        self._layer_types = tuple(type(layer).__name__ for layer in new_prompt_cache(model))
        self._entries: dict[str, _Entry] = {}
        self._pending: list[_Pending] = []
        # Its own priority, not a lower one: a thread the scheduler keeps waiting while it holds the interpreter's lock
        # stalls the decode loop behind it (a soak at the lowest priority served fewer requests: OPERATIONS.md, soak).
        beside = write_beside_above_bytes is not None
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="snapshot-writer") if beside else None
        self._write_beside_above = write_beside_above_bytes or 0
        """Queued bytes (the write under way aside) past which the writer thread takes the oldest snapshot."""
        self._in_flight: _InFlight | None = None
        self.written = 0
        """Snapshots written (on either thread) since the tier was made."""
        self.written_in_background = 0
        """Of those, the ones whose files the writer thread wrote."""
        directory.mkdir(parents=True, exist_ok=True)
        self._scan()

    @property
    def nbytes(self) -> int:
        """Bytes of the snapshots on disk."""
        return sum(entry.record.nbytes for entry in self._entries.values())

    @property
    def entries(self) -> int:
        return len(self._entries)

    @property
    def pending(self) -> bool:
        """Snapshots are queued for writing (or being written by the writer thread)."""
        return bool(self._pending) or self._in_flight is not None

    def best_match(self, prompt: Sequence[int]) -> DiskMatch | None:
        """The snapshot sharing the longest prefix with `prompt` (None when none shares a token)."""
        best: DiskMatch | None = None
        if not prompt:
            return best
        asked = np.asarray(prompt, dtype=np.int32)
        for entry in self._entries.values():
            held = entry.token_array
            if not held.size or held[0] != asked[0]:
                continue
            common = _common_prefix(held, asked)
            if best is None or common > best.common_tokens:
                best = DiskMatch(entry.key, common, entry.record.nbytes)
        return best

    def load(self, key: str) -> tuple[PromptCache, tuple[int, ...]] | None:
        """The snapshot's cache and the tokens it holds, after checking it; None (and the files deleted) when it
        fails a check."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        path = self._data_path(key)
        problem = self._check_file(path, entry.record)
        cache: PromptCache = []
        if problem is None:
            try:
                loaded, metadata = load_prompt_cache(str(path), return_metadata=True)
                cache = list(loaded)
            except Exception as error:  # a file that passed its checksum yet does not parse: still only a miss
                problem = f"unreadable ({type(error).__name__}: {error})"
            else:
                problem = self._check_contents(cache, metadata, entry.record)
        if problem is not None:
            logger.warning("prefix cache: dropping disk snapshot %s: %s", path.name, problem)
            self._delete(key)
            return None
        entry.last_used = time.time()
        try:
            path.touch()  # its age orders eviction after a restart; a read-only folder only loses that
        except OSError as error:
            logger.debug("prefix cache: cannot mark %s as used: %s", path.name, error)
        return cache, entry.record.tokens

    def queue(self, tokens: Sequence[int], cache: PromptCache) -> None:
        """Queue a snapshot of `cache`, which holds `tokens`; a queued one it extends is replaced. A short prompt's
        cache is not queued, but its task's end still lands a finished background write and starts the next."""
        held = tuple(tokens)
        if len(held) >= MIN_SNAPSHOT_TOKENS and not self._holds(held):
            self._pending = [pending for pending in self._pending if pending.tokens != held[: len(pending.tokens)]]
            self._pending.append(_Pending(held, cache, _kv_bytes(cache)))
            self._bound_queue()
        self.advance_background_writes()

    def _holds(self, tokens: tuple[int, ...]) -> bool:
        """A snapshot of exactly `tokens` is on disk or being written."""
        if self._in_flight is not None and self._in_flight.pending.tokens == tokens:
            return True
        return any(entry.record.tokens == tokens for entry in self._entries.values())

    @property
    def queued_bytes(self) -> int:
        """Bytes of KV the snapshots waiting to be written hold (shared with the memory tier while it keeps them)."""
        in_flight = self._in_flight.pending.nbytes if self._in_flight is not None else 0
        return in_flight + self._waiting_bytes  # no mlx call: read at every task's end

    @property
    def _waiting_bytes(self) -> int:
        """Bytes of KV the snapshots not yet taken by the writer thread hold."""
        return sum(pending.nbytes for pending in self._pending)

    def _bound_queue(self) -> None:
        """Drop the oldest queued snapshots while the queue holds more than its budget (the newest too, alone over)."""
        queued = self.queued_bytes
        while self._pending and queued > self._queue_budget:
            dropped = self._pending.pop(0)
            queued -= dropped.nbytes
            self.dropped_from_queue += 1
            logger.info(
                "prefix cache: dropped a queued disk snapshot of %d tokens unwritten: sessions end faster than they "
                "are written and the queue is over its %.2f GB (%d dropped so far)",
                len(dropped.tokens),
                self._queue_budget / 1024**3,
                self.dropped_from_queue,
            )

    def write_pending(self, *, newest: bool = False) -> None:
        """Write the oldest (or `newest`: the latest session's, as a stopping runner does) queued snapshot (seconds
        for a long prompt's cache): call while nothing else runs. A write under way on the writer thread is waited
        for and landed first."""
        self._land_background(wait=True)
        if not self._pending:
            return
        pending = self._pending.pop(-1 if newest else 0)
        key = self._clear_names(pending)
        try:
            record = self._write_files(key, pending)
        except Exception as error:  # any kind, as in the background: a failed snapshot costs a later prefill only
            self._write_failed(key, error)
            return
        self._land(key, pending, record)

    def advance_background_writes(self) -> None:
        """Land a finished background write, then hand the oldest queued snapshot to the writer thread when it is
        free, the queue is over its threshold, and that cache can be written off this thread."""
        self._land_background(wait=False)
        if self._writer is None or self._in_flight is not None or not self._pending:
            return
        if self._waiting_bytes <= self._write_beside_above:
            return  # an idle moment will do: meanwhile a session's next turn may replace it
        if not all(is_plain_kv_cache(layer) for layer in self._pending[0].cache):
            return  # its state may still be mlx work to run: written while idle, on this thread
        pending = self._pending.pop(0)
        key = self._clear_names(pending)
        self._in_flight = _InFlight(key, pending, self._writer.submit(self._write_files, key, pending))

    def _land_background(self, *, wait: bool) -> None:
        in_flight = self._in_flight
        if in_flight is None or not (wait or in_flight.done.done()):
            return
        self._in_flight = None
        try:
            record = in_flight.done.result()
        except Exception as error:  # landed at a task's end: a failed snapshot costs a later prefill, never a request
            self._write_failed(in_flight.key, error)
            return
        if record is not None:
            self.written_in_background += 1
        self._land(in_flight.key, in_flight.pending, record)

    def _clear_names(self, pending: _Pending) -> str:
        """The snapshot's key, with whatever sits under its files' names removed: no snapshot of ours (queue() skips
        prompts already on disk)."""
        key = hashlib.sha256(f"{self._identity}:{pending.tokens}".encode()).hexdigest()[:32]
        _remove(self._partial_path(key))
        _remove(self._data_path(key))
        return key

    def _write_files(self, key: str, pending: _Pending) -> SnapshotRecord | None:
        """Write the snapshot's data and sidecar (None when it is over the whole budget): touches only its own
        files, so it runs on the writer thread too."""
        partial = self._partial_path(key)
        data_path = self._data_path(key)
        save_prompt_cache(str(partial), pending.cache, {"model_identity": self._identity})
        partial.replace(data_path)
        record = SnapshotRecord(
            model_identity=self._identity,
            tokens=pending.tokens,
            nbytes=data_path.stat().st_size,
            sha256=_file_sha256(data_path),
            layer_types=self._layer_types,
        )
        if record.nbytes > self._budget:
            data_path.unlink()
            return None
        self._record_path(key).write_text(record.model_dump_json())
        return record

    def _write_failed(self, key: str, error: Exception) -> None:
        logger.warning("prefix cache: cannot write a disk snapshot to %s: %s", self._directory, error)
        _remove(self._partial_path(key))
        self._delete(key)

    def _land(self, key: str, pending: _Pending, record: SnapshotRecord | None) -> None:
        if record is None:
            return
        self.written += 1
        # A snapshot this one extends holds nothing this one does not.
        for entry in list(self._entries.values()):
            if entry.record.tokens == pending.tokens[: len(entry.record.tokens)]:
                self._delete(entry.key)
        self._entries[key] = _Entry(key, record, time.time())
        self._evict()

    def _evict(self) -> None:
        while self.nbytes > self._budget:
            oldest = min(self._entries.values(), key=lambda entry: entry.last_used)
            self._delete(oldest.key)

    def _scan(self) -> None:
        """Read the sidecars left by earlier runs; drop what belongs to nothing or to another model."""
        for record_path in sorted(self._directory.glob("*.json")):
            key = record_path.stem
            try:
                record = _read_record(record_path)
            except (OSError, ValueError) as error:  # pydantic's ValidationError is a ValueError
                logger.warning("prefix cache: dropping unreadable snapshot record %s: %s", record_path.name, error)
                self._delete(key)
                continue
            if record.model_identity != self._identity:
                logger.warning("prefix cache: dropping disk snapshot %s: it belongs to another model", key)
                self._delete(key)
                continue
            data_path = self._data_path(key)
            if (problem := _kind_problem(data_path)) is not None:
                if data_path.exists() or data_path.is_symlink():
                    logger.warning("prefix cache: dropping disk snapshot %s: %s", data_path.name, problem)
                self._delete(key)
                continue
            self._entries[key] = _Entry(key, record, data_path.lstat().st_mtime)
        for data_path in self._directory.glob("*.safetensors"):  # half-written ones included, of any kind
            if data_path.stem not in self._entries:
                _remove(data_path)
        self._evict()

    def _check_file(self, path: Path, record: SnapshotRecord) -> str | None:
        if record.model_identity != self._identity:
            return "it belongs to another model"
        if record.layer_types != self._layer_types:
            return "its layers do not match this model's"
        if (problem := _kind_problem(path)) is not None:
            return problem
        try:
            size = path.stat().st_size
            if size != record.nbytes:
                return f"{size} bytes where {record.nbytes} were written (truncated or overwritten)"
            if _file_sha256(path) != record.sha256:
                return "checksum mismatch (corrupt)"
        except OSError as error:
            return f"unreadable ({error})"
        return None

    def _check_contents(self, cache: PromptCache, metadata: dict[str, str], record: SnapshotRecord) -> str | None:
        if metadata.get("model_identity") != self._identity:
            return "its contents belong to another model"
        if tuple(type(layer).__name__ for layer in cache) != self._layer_types:
            return "its layers do not match this model's"
        if held_token_count(cache) != len(record.tokens):
            return f"it holds {held_token_count(cache)} tokens, its record says {len(record.tokens)}"
        return None

    def _delete(self, key: str) -> None:
        """Forget the snapshot and remove its files, whatever they turned out to be."""
        self._entries.pop(key, None)
        _remove(self._data_path(key))
        _remove(self._record_path(key))

    def _data_path(self, key: str) -> Path:
        return self._directory / f"{key}.safetensors"

    def _partial_path(self, key: str) -> Path:
        return self._directory / f"{key}.partial.safetensors"  # mlx adds the suffix when a name lacks it

    def _record_path(self, key: str) -> Path:
        return self._directory / f"{key}.json"


def _kind_problem(path: Path) -> str | None:
    """Why `path` is not a regular file the tier may read (it is missing, a directory, a link...), or None."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return "its data file is missing"
    except OSError as error:
        return f"unreadable ({error})"
    if stat.S_ISREG(mode):
        return None
    kind = next((name for is_kind, name in _KIND_NAMES if is_kind(mode)), "not a file")
    return f"it is {kind}, not a regular file"


def _read_record(path: Path) -> SnapshotRecord:
    """The sidecar at `path`; OSError or ValueError when it is not a regular file of a sane size, or not a record."""
    if (problem := _kind_problem(path)) is not None:
        raise ValueError(problem)
    if path.lstat().st_size > _MAX_RECORD_BYTES:
        raise ValueError(f"{path.lstat().st_size} bytes is too large for a snapshot record")
    return SnapshotRecord.model_validate_json(path.read_bytes())


def _kv_bytes(cache: PromptCache) -> int:
    return sum(layer.nbytes for layer in cache)


def _remove(path: Path) -> None:
    """Remove whatever is at `path` (a link itself, never what it points to); a warning when it cannot be."""
    try:
        mode = path.lstat().st_mode
        if stat.S_ISDIR(mode):
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        return
    except OSError as error:
        logger.warning("prefix cache: cannot remove %s (it is left alone, never read): %s", path.name, error)


def _common_prefix(first: TokenArray, second: TokenArray) -> int:
    limit = min(first.size, second.size)
    differing = np.flatnonzero(first[:limit] != second[:limit])
    return int(differing[0]) if differing.size else limit


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while block := file.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()
