"""Handing memory a process has freed back to the system.

glibc's allocator keeps freed memory in its heap for reuse, so a process stays at its peak resident size after a
burst (a large request body, a long prompt's prefill). `malloc_trim` returns the free pages; elsewhere it is a no-op.
"""

import ctypes
import ctypes.util
import gc
from typing import Final

# glibc's mallopt parameter: allocations above this size get their own mapping, unmapped when freed.
_M_MMAP_THRESHOLD: Final = -3
_MMAP_THRESHOLD_BYTES: Final = 256 * 1024


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name)
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


_LIBC: Final = _glibc()


def map_large_allocations() -> None:
    """Give every allocation over 256 KiB its own mapping (glibc only): large buffers then go back to the system when
    freed instead of growing the heap for good (glibc otherwise raises this threshold to the size of the largest
    block freed, which puts the next large buffers on the heap)."""
    if _LIBC is not None:
        _LIBC.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)


def trim_heap() -> None:
    """Return the heap's free pages to the system (glibc only)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def collect_and_trim() -> None:
    """Free what reference cycles hold, then return the heap's free pages to the system (glibc only)."""
    # An exception holds its frames, and so whatever they reference, in a cycle until the cyclic collector runs.
    gc.collect()
    trim_heap()


def freeze_long_lived() -> None:
    """Collect what is garbage now, then exempt every object left from the collector's future passes (`gc.freeze`):
    called once a process has loaded what it keeps for its life. A runner holds about 100,000 tracked objects after
    loading a model (its tokenizers, the model's modules); each full collection walked them all (38 ms on the default
    model's runner), at intervals while it decoded and in every `collect_and_trim`, and after the freeze it takes a
    fraction of a millisecond."""
    gc.collect()
    gc.freeze()
