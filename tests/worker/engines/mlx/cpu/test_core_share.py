"""ggml's thread count by the cores other processes use (`core_share.py`, issue 33): the share computed from two
/proc readings, the count with its hysteresis, `EXO_GGML_THREADS` and `use_threads` fixing it, a real busy child
process seen in /proc, and a model's products the same numbers whatever the count.

The model tests need ggml's CPU library (`uv run exo ggml build`, or EXO_GGML_DIR): without it they skip for a reason
of the machine, a failure under EXO_STRICT_SKIPS=1.
"""

import subprocess
import sys
import time
from collections.abc import Collection, Iterator
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx import nn

from exo.worker.engines.mlx.cpu import core_share as core_share_module
from exo.worker.engines.mlx.cpu import q8_layers
from exo.worker.engines.mlx.cpu.core_share import (
    DROP_SLACK,
    RISE_SLACK,
    WINDOW_SECONDS,
    CoreShare,
    Snapshot,
    allowed_cores,
    fixed_threads,
    others_busy_cores,
    parse_proc_stat,
    parse_self_stat,
    quota_cores,
    read_snapshot,
    threads_for,
)
from exo.worker.engines.mlx.cpu.engine import DECODE_GRAPH_VARIABLE, LAYER_GRAPH_VARIABLE
from exo.worker.engines.mlx.cpu.ggml_library import Ggml, GgmlMatrix
from exo.worker.engines.mlx.cpu.q8_layers import Q8Embedding, Q8Linear, Q8Weights
from tests.worker.engines.mlx.cpu.weight_formats import greedy_step_logits, loaded_fixture

PROC_STAT = """cpu  900 10 300 5000 40 0 5 20 7 0
cpu0 400 5 100 2500 20 0 2 10 7 0
cpu1 500 5 200 2500 20 0 3 10 0 0
cpu2 9000 0 0 0 0 0 0 0 0 0
intr 1 2 3
ctxt 12345
"""


def test_proc_stat_sums_the_allowed_cores_busy_and_total_ticks() -> None:
    # cpu0: busy user+nice+system+irq+softirq+steal = 400+5+100+0+2+10; total adds idle 2500 and iowait 20 (guest
    # 7 is inside user already).
    assert parse_proc_stat(PROC_STAT, {0}) == (517, 3037, 1)
    assert parse_proc_stat(PROC_STAT, {0, 1}) == (517 + 718, 3037 + 3238, 2)
    assert parse_proc_stat(PROC_STAT, {5}) == (0, 0, 0)


def test_self_stat_reads_user_and_system_time_after_a_command_name_with_spaces() -> None:
    line = "4242 (a (b) c) R 1 4242 4242 0 -1 4194304 100 0 0 0 731 69 5 6 20 0 3 0 100 1000 200"
    assert parse_self_stat(line) == 731 + 69


def _snapshot(busy: int, total: int, own: int, cores: int = 2) -> Snapshot:
    return Snapshot(busy=busy, total=total, own=own, cores=cores)


def test_others_busy_cores_is_busy_less_own_over_the_window() -> None:
    before = _snapshot(busy=1000, total=10_000, own=300)
    # 100 ticks a core elapsed (200 over 2 cores): 150 busy, 50 of them ours -> others kept one core busy.
    assert others_busy_cores(before, _snapshot(busy=1150, total=10_200, own=350)) == pytest.approx(1.0)
    # All busy ticks ours: none for others.
    assert others_busy_cores(before, _snapshot(busy=1120, total=10_200, own=420)) == pytest.approx(0.0)
    # Own time counted on a tick the cores' accounting missed: never below 0.
    assert others_busy_cores(before, _snapshot(busy=1010, total=10_200, own=330)) == 0.0
    # No time elapsed: nothing measured.
    assert others_busy_cores(before, before) == 0.0


def test_threads_follow_the_free_cores_with_hysteresis() -> None:
    # Two cores, both ours: drop one thread only once others hold more than DROP_SLACK of a core.
    assert threads_for(DROP_SLACK - 0.05, allowed=2, current=2) == 2
    assert threads_for(DROP_SLACK + 0.05, allowed=2, current=2) == 1
    # Back to two only below RISE_SLACK: in between the count stays where it is.
    assert threads_for((DROP_SLACK + RISE_SLACK) / 2, allowed=2, current=1) == 1
    assert threads_for((DROP_SLACK + RISE_SLACK) / 2, allowed=2, current=2) == 2
    assert threads_for(RISE_SLACK - 0.05, allowed=2, current=1) == 2
    # Never below one, never above the allowed cores.
    assert threads_for(7.5, allowed=2, current=2) == 1
    assert threads_for(0.0, allowed=8, current=1) == 8
    assert threads_for(2.6, allowed=8, current=8) == 5  # 8 - ceil(2.6 - 0.4)
    assert threads_for(2.3, allowed=8, current=5) == 5  # 6 threads leave 2 cores: not until others < 2 + RISE_SLACK
    assert threads_for(2.1, allowed=8, current=5) == 6


class _FakeProc:
    """Readings a test hands out in turn, and a clock it moves."""

    def __init__(self) -> None:
        self.now = 0.0
        self.busy = self.total = self.own = 0
        self.reads = 0

    def advance(self, seconds: float, *, others: float, own: float, cores: int = 2) -> None:
        """`seconds` pass (100 ticks a second a core) with others holding `others` cores and this process `own`."""
        ticks = seconds * 100
        self.now += seconds
        self.total += round(ticks * cores)
        self.busy += round(ticks * (others + own))
        self.own += round(ticks * own)

    def read(self, cores: Collection[int]) -> Snapshot:
        self.reads += 1
        return Snapshot(busy=self.busy, total=self.total, own=self.own, cores=len(cores))

    def clock(self) -> float:
        return self.now


def test_a_core_share_reads_at_most_every_window_and_changes_with_hysteresis() -> None:
    proc = _FakeProc()
    share = CoreShare({0, 1}, read=proc.read, clock=proc.clock)
    assert share.adaptive
    assert share.threads() == 2
    assert proc.reads == 1
    proc.advance(WINDOW_SECONDS / 2, others=1.0, own=1.0)
    assert share.threads() == 2
    assert proc.reads == 1
    proc.advance(WINDOW_SECONDS / 2, others=1.0, own=1.0)
    assert share.threads() == 1
    assert share.others == pytest.approx(1.0, abs=0.02)
    proc.advance(WINDOW_SECONDS, others=0.3, own=1.0)
    assert share.threads() == 1  # others at 0.3: between the slacks, no change
    proc.advance(WINDOW_SECONDS, others=0.05, own=1.5)  # our own busy threads are not others
    assert share.threads() == 2
    assert share.changes == 2


def test_without_proc_the_count_is_every_allowed_core(tmp_path: Path) -> None:
    assert read_snapshot({0, 1}, tmp_path) is None
    share = CoreShare({0, 1, 2}, read=lambda cores: read_snapshot(cores, tmp_path))
    assert not share.adaptive
    assert share.threads() == 3


def test_a_fake_proc_directory_is_read(tmp_path: Path) -> None:
    (tmp_path / "self").mkdir()
    (tmp_path / "stat").write_text(PROC_STAT)
    (tmp_path / "self" / "stat").write_text("1 (python) S 0 1 1 0 -1 0 0 0 0 0 40 2 0 0 20 0 1 0 1 1 1")
    assert read_snapshot({0, 1}, tmp_path) == Snapshot(busy=517 + 718, total=3037 + 3238, own=42, cores=2)


def test_exo_ggml_threads_fixes_the_count() -> None:
    assert fixed_threads({}) is None
    assert fixed_threads({"EXO_GGML_THREADS": "auto"}) is None
    assert fixed_threads({"EXO_GGML_THREADS": "3"}) == 3
    for bad in ("0", "-1", "two"):
        with pytest.raises(ValueError, match="EXO_GGML_THREADS"):
            fixed_threads({"EXO_GGML_THREADS": bad})
    proc = _FakeProc()
    share = CoreShare({0, 1}, fixed=1, read=proc.read, clock=proc.clock)
    proc.advance(5.0, others=0.0, own=1.0)
    assert not share.adaptive
    assert share.threads() == 1
    assert proc.reads == 0


@pytest.fixture
def busy_children() -> Iterator[int]:
    """Processes spinning on all of this process's cores but one (one on a single core): how many."""
    count = max(len(allowed_cores()) - 1, 1)
    children = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(0.3)  # started and spinning
        yield count
    finally:
        for child in children:
            child.kill()
            child.wait()


def test_real_busy_processes_are_seen_as_others_and_the_count_drops(busy_children: int) -> None:
    share = CoreShare()
    assert share.adaptive  # a Linux machine: /proc is there
    assert share.threads() == share.allowed
    before = read_snapshot(allowed_cores())
    time.sleep(1.0)
    after = read_snapshot(allowed_cores())
    assert before is not None
    assert after is not None
    # The children spin a core each (other processes on a shared machine can only add to that); this process sleeps.
    others = others_busy_cores(before, after)
    assert busy_children - 0.3 <= others <= share.allowed + 0.1
    assert share.threads() == max(share.allowed - busy_children, 1)
    assert share.others >= busy_children - 0.3


class _Flipping:
    """A core share whose count alternates 1, 2, 1, 2... at each product."""

    def __init__(self) -> None:
        self.calls = 0

    def threads(self) -> int:
        self.calls += 1
        return 1 + self.calls % 2


def _decode_logits(model: nn.Module, steps: int) -> list[np.ndarray]:
    return greedy_step_logits(model, mx.array([[(index * 11) % 200 + 3 for index in range(24)]]), steps)


def _set_threads(model: nn.Module, threads: int | None) -> None:
    for _, module in model.named_modules():
        if isinstance(module, (Q8Linear, Q8Embedding)):
            module.q8.use_threads(threads)


@pytest.mark.usefixtures("ggml")
def test_a_models_products_are_the_same_whatever_the_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefill and decode steps (fused MLPs, grouped siblings, the output head) on 1 or 2 threads, fixed, or with the
    count changing between products: the same logits, bit for bit (ggml splits rows between threads, each row's
    dot products computed the same way). The passes are mlx-lm's model's here (the decode and layer graphs off)."""
    monkeypatch.setenv(DECODE_GRAPH_VARIABLE, "off")
    monkeypatch.setenv(LAYER_GRAPH_VARIABLE, "off")
    model = loaded_fixture("tiny-qwen-tools", "q8_0").model
    _set_threads(model, 1)
    one = _decode_logits(model, steps=4)
    _set_threads(model, 2)
    two = _decode_logits(model, steps=4)
    flipping = _Flipping()
    monkeypatch.setattr(q8_layers, "core_share", lambda: flipping)
    _set_threads(model, None)
    changing = _decode_logits(model, steps=4)
    assert flipping.calls > 20  # every product read the count
    for a, b, c in zip(one, two, changing, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


def test_use_threads_fixes_a_matrix_count_over_the_process_share(ggml: Ggml, monkeypatch: pytest.MonkeyPatch) -> None:
    matrix = GgmlMatrix(ggml, "Q8_0", 64, 64)
    matrix.fill(0, np.random.default_rng(0).normal(size=(64, 64)).astype(np.float32))
    weights = Q8Weights(matrix)
    flipping = _Flipping()
    monkeypatch.setattr(q8_layers, "core_share", lambda: flipping)
    assert [weights.threads for _ in range(3)] == [2, 1, 2]
    weights.use_threads(3)
    assert [weights.threads for _ in range(3)] == [3, 3, 3]
    x = np.random.default_rng(1).normal(size=(2, 64)).astype(np.float32)
    np.testing.assert_array_equal(weights.product(x), matrix.product(x, 1, ggml.shared_threadpool(1, 0)))


def test_the_process_share_reads_exo_ggml_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    core_share_module.core_share.cache_clear()
    monkeypatch.setenv("EXO_GGML_THREADS", "1")
    try:
        share = core_share_module.core_share()
        assert not share.adaptive
        assert share.threads() == 1
        assert q8_layers.ggml_threads() == 1
        core_share_module.core_share.cache_clear()
        monkeypatch.setenv("EXO_GGML_THREADS", "many")
        with pytest.raises(ValueError, match="EXO_GGML_THREADS"):
            core_share_module.core_share()
    finally:
        core_share_module.core_share.cache_clear()


def test_the_current_count_is_none_until_a_process_runs_ggml(monkeypatch: pytest.MonkeyPatch) -> None:
    core_share_module.core_share.cache_clear()
    monkeypatch.setenv("EXO_GGML_THREADS", "1")
    try:
        assert core_share_module.current_ggml_threads() is None  # no share made: /proc is not read
        assert core_share_module.core_share.cache_info().currsize == 0
        core_share_module.core_share()
        assert core_share_module.current_ggml_threads() == 1
    finally:
        core_share_module.core_share.cache_clear()


def test_a_cpu_quota_caps_the_count_whatever_cores_are_free() -> None:
    # A container allowed on 16 cores but paying for 4: never more than 4 threads, fewer once others fill the cores.
    assert threads_for(0.0, allowed=16, current=4, limit=4) == 4
    assert threads_for(11.0, allowed=16, current=4, limit=4) == 4  # 5 cores left free: still the quota's 4
    assert threads_for(13.5, allowed=16, current=4, limit=4) == 2  # 16 - ceil(13.5 - 0.4)
    assert threads_for(15.9, allowed=16, current=3, limit=4) == 1
    proc = _FakeProc()
    share = CoreShare(set(range(16)), quota=4, read=proc.read, clock=proc.clock)
    assert (share.limit, share.threads()) == (4, 4)
    assert CoreShare({0, 1}, quota=8, read=proc.read, clock=proc.clock).limit == 2  # a quota beyond the cores


def _cgroup_file(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_quota_is_read_from_cgroup_v2_and_its_ancestors(tmp_path: Path) -> None:
    proc, cgroups = tmp_path / "proc", tmp_path / "cgroup"
    _cgroup_file(proc, "self/cgroup", "0::/system.slice/exo.service\n")
    assert quota_cores(proc, cgroups) is None  # no cpu.max anywhere: no quota
    _cgroup_file(cgroups, "system.slice/exo.service/cpu.max", "max 100000\n")
    assert quota_cores(proc, cgroups) is None
    _cgroup_file(cgroups, "system.slice/cpu.max", "250000 100000\n")
    assert quota_cores(proc, cgroups) == 2  # 2.5 cores on the parent: rounded down
    _cgroup_file(cgroups, "system.slice/exo.service/cpu.max", "50000 100000\n")
    assert quota_cores(proc, cgroups) == 1  # half a core: at least one thread


def test_the_quota_is_read_from_cgroup_v1_cfs(tmp_path: Path) -> None:
    proc, cgroups = tmp_path / "proc", tmp_path / "cgroup"
    _cgroup_file(proc, "self/cgroup", "4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n0::/\n")
    _cgroup_file(cgroups, "cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "-1\n")
    _cgroup_file(cgroups, "cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n")
    assert quota_cores(proc, cgroups) is None  # -1: no quota
    _cgroup_file(cgroups, "cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "300000\n")
    assert quota_cores(proc, cgroups) == 3
    assert quota_cores(tmp_path / "missing", cgroups) is None  # no /proc (macOS)


def test_this_machine_s_quota_reads_without_error() -> None:
    # Whatever the machine running the tests has: a whole number of cores or none, never an exception.
    quota = quota_cores()
    assert quota is None or quota >= 1


def test_work_after_idle_measures_its_own_window_not_what_others_did_meanwhile() -> None:
    proc = _FakeProc()
    share = CoreShare({0, 1}, read=proc.read, clock=proc.clock)
    assert share.threads() == 2
    proc.advance(3 * WINDOW_SECONDS, others=1.5, own=0.0)  # idle here while another process took the cores
    share.start_window()  # work arrives: others are done by now
    assert share.threads() == 2
    proc.advance(WINDOW_SECONDS, others=0.0, own=2.0)
    assert share.threads() == 2
    assert share.changes == 0
    # Without the new window, the same history costs the work a thread.
    unaware = CoreShare({0, 1}, read=proc.read, clock=proc.clock)
    assert unaware.threads() == 2
    proc.advance(3 * WINDOW_SECONDS, others=1.5, own=0.0)
    assert unaware.threads() == 1
    # Others still busy once the work runs: its first window drops the thread as before.
    share.start_window()
    proc.advance(WINDOW_SECONDS, others=1.5, own=0.5)
    assert share.threads() == 1
