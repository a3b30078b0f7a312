"""The helper that accepts a step's tokens beside the next launch: jobs run in order on another thread, a job's error
is raised where the loop waits for it, and `wait` returns whatever the job did."""

import threading

import pytest

from exo.worker.engines.mlx.generator.beside import BESIDE_THREAD_NAME, BesideWorker


def test_jobs_run_in_order_on_the_helper_thread() -> None:
    worker = BesideWorker()
    ran: list[tuple[int, str]] = []

    def job(index: int) -> int:
        ran.append((index, threading.current_thread().name))
        return index * 10

    handles = [worker.submit(lambda index=index: job(index)) for index in range(5)]
    assert [handle.result() for handle in handles] == [0, 10, 20, 30, 40]
    assert ran == [(index, BESIDE_THREAD_NAME) for index in range(5)]
    assert handles[0].result() == 0  # a second read returns at once
    worker.close()


def test_a_jobs_error_is_raised_where_the_loop_waits_and_the_helper_goes_on() -> None:
    worker = BesideWorker()

    def broken() -> int:
        raise ValueError("the parser broke")

    failed = worker.submit(broken)
    failed.wait()  # waiting alone does not raise
    with pytest.raises(ValueError, match="the parser broke"):
        failed.result()
    assert worker.submit(lambda: "still serving").result() == "still serving"
    worker.close()
