"""A step's tokens accepted on a helper thread while the loop thread launches the next forward pass.

On mlx's CPU backend `mx.async_eval` does not return until most of the pass is computed (mlx keeps at most a few
operations queued ahead of the thread that launches them), so work placed after the launch in the loop still waits
for the pass: nothing the host does for step t overlaps step t+1 there. `mx.async_eval` releases the interpreter's
lock while it waits, so a second thread can run Python meanwhile. The loop reads step t's tokens (already computed:
the launch before computed them), hands their acceptance (detokenizing, tool-call parsing, stop checks: `ChatRequest`
state only, no mlx) to the helper, launches step t+1, and takes the chunks once the launch returns. What the request
does with its tokens is the same code on the same tokens in the same order, so its chunks are the same.

On an accelerator the launch returns at once and the loop's own accept already runs while the device computes; there
the helper would only add two thread hand-offs, so it is used only where the launch computes on the host
(`launch_computes_on_host`).
"""

import functools
import queue
import threading
import time
from collections.abc import Callable
from typing import Final, Generic, TypeVar

import mlx.core as mx
from mlx_lm.generate import generation_stream

from exo.worker.engines.mlx.step_clock import STEP_CLOCK

R = TypeVar("R")

AfterLaunch = Callable[[], None]
"""What the loop calls as soon as the launch returns: it waits for the tokens handed over before it to be accepted
(counted as parse), so the helper's work is never left running into the loop's next part."""

BESIDE_THREAD_NAME: Final = "exo-accept-beside"


def launch(*arrays: mx.array | list[mx.array], after: AfterLaunch | None = None) -> None:
    """`mx.async_eval(*arrays)`, counted as the launch, then `after` where tokens went to the helper before it."""
    with STEP_CLOCK.part("launch"):
        mx.async_eval(*arrays)
    if after is not None:
        after()


def launch_computes_on_host() -> bool:
    """Whether the model's steps are computed by the CPU (mlx's CPU backend, or exo's CPU engine on it): there
    `mx.async_eval` returns only once most of a pass is done."""
    return generation_stream.device == mx.cpu


class Accepted(Generic[R]):
    """The outcome of one job handed to the helper: `result` waits for it (the loop thread's wait counts as parsing,
    on its critical path) and raises what the job raised."""

    __slots__ = ("_done", "_error", "_value")

    def __init__(self) -> None:
        self._done = threading.Lock()
        self._done.acquire()  # released by the helper once the job ran: the cheapest wait CPython has
        self._value: R | None = None
        self._error: BaseException | None = None

    def result(self) -> R:
        self.wait()
        if self._error is not None:
            raise self._error
        return self._value  # pyright: ignore[reportReturnType] -- set before the lock was released

    def wait(self) -> None:
        """Until the job ran (whatever it raised stays with `result`): before a request the job works on is failed or
        cancelled, so the helper is done with it."""
        with STEP_CLOCK.part("parse"):
            self._done.acquire()
            self._done.release()  # a second wait returns at once

    def settle(self, value: R | None, error: BaseException | None) -> None:
        """The helper's side: the job's value or error, then the loop thread may go on."""
        self._value, self._error = value, error
        self._done.release()


class BesideWorker:
    """One daemon thread running jobs in the order handed to it; each job's own time is added to the step clock as
    work done beside the loop (`StepClock.add_beside`), not as the loop's."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], object], Accepted[object]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=BESIDE_THREAD_NAME, daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], R]) -> Accepted[R]:
        accepted: Accepted[R] = Accepted()
        self._jobs.put((job, accepted))  # pyright: ignore[reportArgumentType] -- the job's result goes to its own handle
        return accepted

    def close(self) -> None:
        """Stop the thread once the jobs handed to it ran."""
        self._jobs.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (item := self._jobs.get()) is not None:
            job, accepted = item
            started = time.perf_counter()
            try:
                value = job()
            except BaseException as error:  # handed to the loop thread, which raises it where it waits
                STEP_CLOCK.add_beside(time.perf_counter() - started)
                accepted.settle(None, error)
                continue
            STEP_CLOCK.add_beside(time.perf_counter() - started)
            accepted.settle(value, None)


@functools.cache
def beside_worker() -> BesideWorker:
    """The process's helper (one serving loop per runner process; started on first use, idle in a queue's wait)."""
    return BesideWorker()
