"""ggml's thread count chosen by how many of this process's cores other processes are using now (issue 33).

ggml's pool threads meet at a barrier after each op of a graph: when another process holds one of the cores, a pool
thread waits for its turn and every barrier of every graph waits with it. Measured on the 2-core AMD EPYC
(docs/PERFORMANCE.md section 12): quiet, two threads were as fast as one or faster; with other processes busy, the
same products took 641–1,276 ms a decode step on two threads against 53–67 ms on one. The load average cannot tell
the two apart (it counts this process's own threads, and lags by a minute).

`CoreShare` reads, at most every `WINDOW_SECONDS`, the busy time of the cores this process may run on (/proc/stat,
steal included: a hypervisor's other guests are other processes too) and this process's own CPU time, all its
threads (/proc/self/stat), and takes the difference over the window: the cores others kept busy
(`others_busy_cores`). ggml then runs on the cores left (`threads_for`), dropping a thread as soon as others hold
more than `DROP_SLACK` of a core beyond what the threads leave free, and taking it back only once they hold less
than `RISE_SLACK` (hysteresis: a count does not flap on noise between the two). Where /proc cannot be read (macOS)
the count stays every allowed core, as before. A CPU quota (a container's `--cpus`: cgroup v2 `cpu.max` or v1's CFS
quota, on the process's cgroup or an ancestor) caps the count at the cores it pays for. `EXO_GGML_THREADS` fixes the
count (a positive integer; `auto` or unset: adaptive).
"""

import logging
import math
import os
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Final

logger = logging.getLogger(__name__)

THREADS_VARIABLE: Final = "EXO_GGML_THREADS"
"""A positive integer fixes ggml's thread count; `auto` (or unset) chooses it by the cores others use."""
WINDOW_SECONDS: Final = 0.5
"""The shortest window the share is measured over (100 ticks a second: 50 ticks a core at least)."""
DROP_SLACK: Final = 0.4
"""Others may hold this much of a core beyond the free cores before ggml drops a thread."""
RISE_SLACK: Final = 0.15
"""ggml takes a thread back only when others hold less than this much of a core beyond the free cores."""

_BUSY_FIELDS: Final = (0, 1, 2, 5, 6, 7)
"""user, nice, system, irq, softirq, steal among a /proc/stat cpu line's counters (idle and iowait are not busy;
guest time is already inside user and nice)."""


def allowed_cores() -> frozenset[int]:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return frozenset(os.sched_getaffinity(0))
    return frozenset(range(max(os.cpu_count() or 1, 1)))


@dataclass(frozen=True)
class Snapshot:
    """Cumulative CPU times at one moment, in clock ticks: the allowed cores' busy and total time, summed over those
    cores, and this process's own (every thread's user and system time)."""

    busy: int
    total: int
    own: int
    cores: int


def parse_proc_stat(text: str, cores: Collection[int]) -> tuple[int, int, int]:
    """(busy ticks, total ticks, cores found) summed over the `cpuN` lines of /proc/stat whose N is in `cores`."""
    busy = total = found = 0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cores:
            continue
        values = [int(value) for value in rest.split()]
        busy += sum(values[index] for index in _BUSY_FIELDS if index < len(values))
        total += sum(values[:8])  # guest and guest_nice are counted in user and nice already
        found += 1
    return busy, total, found


def parse_self_stat(text: str) -> int:
    """utime + stime of /proc/<pid>/stat (every thread of the process), in clock ticks. The command name (field 2)
    may hold spaces and parentheses: the fields are counted after its last `)`."""
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of the line; the state (field 3) is fields[0]


def read_snapshot(cores: Collection[int], proc: Path = Path("/proc")) -> Snapshot | None:
    """The allowed cores' and this process's CPU times now; None where /proc cannot be read or names none of the
    cores (macOS, a restricted container)."""
    try:
        busy, total, found = parse_proc_stat((proc / "stat").read_text(), cores)
        own = parse_self_stat((proc / "self" / "stat").read_text())
    except (OSError, ValueError, IndexError):
        return None
    return Snapshot(busy=busy, total=total, own=own, cores=found) if found else None


def others_busy_cores(before: Snapshot, after: Snapshot) -> float:
    """How many of the allowed cores other processes kept busy between two snapshots, on average: the cores' busy
    time less this process's own, over the window's length (total ticks per core). 0 for an empty window."""
    elapsed = (after.total - before.total) / max(after.cores, 1)
    if elapsed <= 0:
        return 0.0
    others = (after.busy - before.busy) - (after.own - before.own)
    return max(0.0, others / elapsed)


def threads_for(others: float, allowed: int, current: int, limit: int | None = None) -> int:
    """ggml's threads given others' busy cores among the `allowed` cores: the cores they leave, dropping below
    `current` once others hold more than `DROP_SLACK` of a core beyond what `current` threads leave free, rising above
    it only once they hold less than `RISE_SLACK` beyond what the higher count leaves. Always 1 to `limit` (the cores
    the process's CPU quota pays for, `quota_cores`; `allowed` without one)."""
    most = allowed if limit is None else min(limit, allowed)

    def fit(slack: float) -> int:
        return min(max(allowed - math.ceil(others - slack), 1), most)

    down, up = fit(DROP_SLACK), fit(RISE_SLACK)
    if down < current:
        return down
    if up > current:
        return up
    return min(max(current, 1), most)


def quota_cores(proc: Path = Path("/proc"), cgroups: Path = Path("/sys/fs/cgroup")) -> int | None:
    """How many cores' worth of CPU time this process's cgroup and its ancestors may use (a container's `--cpus`, a
    systemd unit's CPUQuota), rounded down and at least 1; None without a quota or where it cannot be read. The
    cores the process may run on can be many more: threads beyond the quota are throttled, and ggml's barriers then
    wait for the throttled ones."""
    try:
        memberships = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    quotas: list[float] = []
    for membership in memberships:
        _, controllers, path = membership.split(":", 2)
        if controllers == "":  # cgroup v2: cpu.max holds "<quota> <period>" or "max <period>"
            quotas += _quotas_up(cgroups, path, lambda folder: _v2_quota(folder / "cpu.max"))
        elif "cpu" in controllers.split(","):  # cgroup v1: the cpu controller's CFS quota and period
            mount = cgroups / controllers if (cgroups / controllers).is_dir() else cgroups / "cpu"
            quotas += _quotas_up(mount, path, _v1_quota)
    return max(math.floor(min(quotas)), 1) if quotas else None


def _quotas_up(root: Path, path: str, quota: Callable[[Path], float | None]) -> list[float]:
    """The quotas set on the cgroup at `path` under `root` and on each of its ancestors up to `root`."""
    found: list[float] = []
    folder = root / path.strip("/")
    while True:
        if (value := quota(folder)) is not None:
            found.append(value)
        if folder == root or root not in folder.parents:
            return found
        folder = folder.parent


def _v2_quota(cpu_max: Path) -> float | None:
    try:
        quota, period = cpu_max.read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def _v1_quota(folder: Path) -> float | None:
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def fixed_threads(environment: dict[str, str] | None = None) -> int | None:
    """The count `EXO_GGML_THREADS` fixes, or None (adaptive). Raises ValueError for a value that is neither `auto`
    nor a positive integer."""
    value = (os.environ if environment is None else environment).get(THREADS_VARIABLE, "auto").strip()
    if value in ("", "auto"):
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{THREADS_VARIABLE}={value!r}: expected a positive integer or 'auto'")
    return int(value)


class CoreShare:
    """The process's current ggml thread count (`threads()`: a cached int, re-measured at most every
    `WINDOW_SECONDS`)."""

    def __init__(
        self,
        cores: Collection[int] | None = None,
        *,
        fixed: int | None = None,
        quota: int | None = None,
        read: Callable[[Collection[int]], Snapshot | None] = read_snapshot,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cores = frozenset(allowed_cores() if cores is None else cores)
        self.allowed = max(len(self._cores), 1)
        self.limit = self.allowed if quota is None else max(min(quota, self.allowed), 1)
        """The most threads: the allowed cores, or fewer where a CPU quota pays for fewer (`quota_cores`)."""
        self._read = read
        self._clock = clock
        self._threads = self.limit if fixed is None else fixed
        self.others = 0.0
        """Others' busy cores over the last window measured."""
        self.changes = 0
        """How many times the count changed."""
        self._last = None if fixed is not None else read(self._cores)
        self._last_at = clock()

    @property
    def adaptive(self) -> bool:
        return self._last is not None

    def threads(self) -> int:
        """The thread count for the next product."""
        if self._last is None:
            return self._threads
        now = self._clock()
        if now - self._last_at >= WINDOW_SECONDS:
            self._update(now)
        return self._threads

    def start_window(self) -> None:
        """Start the next window now, keeping the count: called as the process turns from idle to work, so the first
        window of that work measures others while it runs, not what they did while this process waited (an agent's
        tool, or another server taking its turn, busy right before the request came would otherwise cost this work a
        thread for a whole window)."""
        if self._last is None:
            return
        snapshot = self._read(self._cores)
        if snapshot is not None:
            self._last, self._last_at = snapshot, self._clock()

    def _update(self, now: float) -> None:
        snapshot = self._read(self._cores)
        if snapshot is None or self._last is None:
            return
        self.others = others_busy_cores(self._last, snapshot)
        self._last, self._last_at = snapshot, now
        chosen = threads_for(self.others, self.allowed, self._threads, self.limit)
        if chosen != self._threads:
            logger.info(
                "ggml threads %d -> %d: other processes kept %.2f of %d cores busy",
                self._threads,
                chosen,
                self.others,
                self.allowed,
            )
            self._threads = chosen
            self.changes += 1


def current_ggml_threads() -> int | None:
    """ggml's thread count now where this process runs ggml's products (its `core_share` was made: the model loaded
    with ggml weights), else None. Never reads /proc for a process without ggml weights."""
    return core_share().threads() if core_share.cache_info().currsize else None


def start_ggml_window() -> None:
    """`CoreShare.start_window` where this process runs ggml's products (else nothing: no /proc read)."""
    if core_share.cache_info().currsize:
        core_share().start_window()


@cache
def core_share() -> CoreShare:
    """The process's one `CoreShare` (made on first use; `EXO_GGML_THREADS` read then)."""
    share = CoreShare(fixed=fixed_threads(), quota=quota_cores())
    if share.adaptive:
        quota = f", at most {share.limit} (the CPU quota)" if share.limit < share.allowed else ""
        logger.info(
            "ggml threads: %d of %d cores%s, following the cores others use", share.threads(), share.allowed, quota
        )
    else:
        logger.info("ggml threads: %d (%s, or no /proc)", share.threads(), THREADS_VARIABLE)
    return share
