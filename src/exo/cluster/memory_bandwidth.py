"""How fast this node's CPU streams memory: the figure placement's `auto` rule turns a model's bytes read per token
into decode time with (master/split_estimates.py).

Decoding one token reads every weight a rank holds once, so its time is about the bytes read over the memory
bandwidth. The figure is the best of a few copies of a 64 MiB array (bytes read plus bytes written over the time),
measured once when the node starts (about a tenth of a second). It is what the CPU reaches with numpy: a GPU on the
same unified memory (Apple silicon) reads faster, so on such a node the estimate of compute per token is high.
"""

import time
from typing import Final

import numpy as np

COPY_BYTES: Final = 64 * 1024 * 1024
COPIES: Final = 4


def measure_memory_bandwidth() -> float:
    """Bytes per second through memory: the fastest of COPIES copies of COPY_BYTES, counting the read and the write."""
    source = np.ones(COPY_BYTES // 8, dtype=np.float64)
    target = np.empty_like(source)
    best = float("inf")
    for _ in range(COPIES):
        started = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - started)
    return 2 * COPY_BYTES / best
