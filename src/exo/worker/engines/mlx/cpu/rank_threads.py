"""A pipeline rank's BLAS threads sleep as soon as a pass ends, so the next rank gets the cores.

Intel's OpenMP runtime (the threading layer exo gives the MKL wheel) keeps its worker threads spinning for 200 ms
after each parallel region (``KMP_BLOCKTIME``'s default), which suits one process running matmul after matmul. A
pipeline's ranks take turns: a rank's pass ends and the next rank's begins, often on the same machine, and the first
rank's spinning threads then take the cores the next rank computes on (measured in docs/CLUSTER.md). One node's
runner keeps the default: its own next matmul follows at once.

The runtime reads the variable when it starts its threads, at the first BLAS call, so this runs before any.
"""

from collections.abc import MutableMapping

BLOCKTIME_VARIABLE = "KMP_BLOCKTIME"


def idle_threads_sleep(environment: MutableMapping[str, str]) -> None:
    """Make the OpenMP runtime's idle worker threads sleep at once, unless the user chose a block time."""
    environment.setdefault(BLOCKTIME_VARIABLE, "0")
