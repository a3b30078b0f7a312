"""A runner's memory reports (`memory_reports.py`): sent only when the memory changed, and on a busy follower rank
(tasks leaving it one after another) at most once per interval, while its idle report always goes."""

import multiprocessing

import mlx.core as mx

from exo.shared.types.worker.runner_response import RunnerMemoryReport, RunnerResponseAdapter
from exo.worker.runner.channel import RunnerChannel
from exo.worker.runner.memory_reports import MemoryReports

HOUR = 3600.0


def test_leaving_tasks_report_at_most_once_an_interval_and_idle_reports_what_changed() -> None:
    ours, theirs = multiprocessing.Pipe()
    channel = RunnerChannel(ours)
    reports = MemoryReports(channel, None)
    held: list[mx.array] = []

    def allocate() -> None:  # the runner's memory changes between reports, as a task's cache does
        held.append(mx.zeros((1 << 20,)))
        mx.eval(held[-1])

    reports.report(at_most_every=HOUR)  # the first goes
    for _ in range(3):
        allocate()
        reports.report(at_most_every=HOUR)  # changed, but within the interval
    reports.report()  # the idle report: what the three allocations changed goes now
    reports.report()  # nothing changed since the last send
    allocate()
    reports.report(at_most_every=0.0)
    channel.close()

    sent: list[RunnerMemoryReport] = []
    while theirs.poll(0.5):
        message = RunnerResponseAdapter.validate_json(theirs.recv_bytes())
        assert isinstance(message, RunnerMemoryReport)
        sent.append(message)
    assert len(sent) == 3
    first, idle, last = (report.memory.mlx_active_bytes for report in sent)
    assert first < idle < last
