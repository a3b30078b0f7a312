"""The runner's end of the pipe to its supervisor: typed messages both ways.

A message is encoded on the sender's thread (what it refers to may change once `send` returns) and written to the
pipe by the channel's own writer thread, in the order sent. A write wakes the supervisor's process, and on a machine
with few cores that process takes the core the serving loop was on: written by the loop itself, the wake-up held a
decode step 0.1-0.8 ms (docs/PERFORMANCE.md, issue 36); written here, the loop goes on to its next step meanwhile.

The decode loop asks every step whether a message came (`message_waiting`) without a system call: a watcher thread
of the channel's own waits on the pipe and raises a flag. A poll from the loop would release the interpreter's lock,
and the writer thread, woken by the step's send, took it there: the write then ran on the loop's time instead of
while the loop waits on the model.
"""

import json
import os
import queue
import select
import struct
import threading
from multiprocessing.connection import Connection

from pydantic import ValidationError

from exo.shared.types.common import TaskId
from exo.shared.types.worker.runner_response import (
    RunnerRequest,
    RunnerRequestAdapter,
    RunnerResponse,
    RunnerResponseAdapter,
)


class UnreadableRequestError(Exception):
    """A message from the supervisor did not validate; `task_id` is the task it was for, when one can be read."""

    def __init__(self, error: ValidationError, payload: bytes) -> None:
        super().__init__(f"{error.error_count()} validation error(s), first: {error.errors()[0]['msg']}")
        self.task_id = _lenient_task_id(payload)


def _lenient_task_id(payload: bytes) -> TaskId | None:
    try:
        message: object = json.loads(payload)
    except ValueError:
        return None
    task = message.get("task") if isinstance(message, dict) else None
    task_id = task.get("task_id") if isinstance(task, dict) else None
    return TaskId(task_id) if isinstance(task_id, str) else None


def _framed(payload: bytes) -> bytes:
    """`payload` as `Connection.send_bytes` frames it (its length, then the bytes), read by `recv_bytes`: built
    before it is queued, so the writer thread holds the interpreter's lock only to hand it to `os.write`."""
    size = len(payload)
    header = struct.pack("!i", size) if size <= 0x7FFFFFFF else struct.pack("!iQ", -1, size)
    return header + payload


def _write_all(descriptor: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(descriptor, view) :]


class _Stop:
    """Ends the writer thread once everything queued before it is written."""


class RunnerChannel:
    """Typed wrapper around the runner's end of the pipe; `close` it (or `flush`) before the process ends, so that
    nothing sent is lost."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._outgoing: queue.SimpleQueue[bytes | threading.Event | _Stop] = queue.SimpleQueue()
        self._failure: Exception | None = None
        # One poll object for the life of the channel: the serving loop checks for messages every decode step, and
        # `Connection.poll` builds and tears down a selector each time (3.4 us a call against 0.5 us here, quiet).
        self._readable = select.poll()
        self._readable.register(connection.fileno(), select.POLLIN)
        self._writer = threading.Thread(target=self._write, name="runner-channel-writer", daemon=True)
        self._writer.start()
        # Raised by the watcher thread once the pipe is readable; lowered by `poll` when it finds nothing, which
        # sets the watcher waiting on the pipe again (a level-triggered poll: nothing that arrives is missed).
        self._maybe_readable = False
        self._watch_again = threading.Event()
        self._watch_again.set()
        self._watcher = threading.Thread(target=self._watch, name="runner-channel-watcher", daemon=True)
        self._watcher.start()

    def send(self, message: RunnerResponse) -> None:
        """Queue `message` for the pipe (written at once after `close`); raises the error that broke the pipe, once
        a write has failed."""
        self._raise_failure()
        frame = _framed(RunnerResponseAdapter.dump_json(message))
        if self._writer.is_alive():
            self._outgoing.put(frame)
        else:
            _write_all(self._connection.fileno(), frame)

    def flush(self) -> None:
        """Wait until everything sent so far is written; raises the error that broke the pipe, if a write failed."""
        if self._writer.is_alive():
            written = threading.Event()
            self._outgoing.put(written)
            written.wait()
        self._raise_failure()

    def close(self) -> None:
        """Write what is queued, then end the writer thread (the pipe itself stays open)."""
        if self._writer.is_alive():
            self._outgoing.put(_Stop())
            self._writer.join()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _write(self) -> None:
        while True:
            item = self._outgoing.get()
            if isinstance(item, _Stop):
                return
            if isinstance(item, threading.Event):
                item.set()
            elif self._failure is None:  # after a failed write nothing more reaches the pipe, as a raise would stop
                try:
                    _write_all(self._connection.fileno(), item)
                except Exception as error:  # kept for the sender's thread to raise: this thread lives on to `close`
                    self._failure = error

    def receive(self) -> RunnerRequest:
        """The next request; raises UnreadableRequestError for one that does not validate, EOFError once the
        supervisor has closed the pipe."""
        payload = self._connection.recv_bytes()
        try:
            return RunnerRequestAdapter.validate_json(payload)
        except ValidationError as error:
            raise UnreadableRequestError(error, payload) from error

    def poll(self, timeout: float = 0.0) -> bool:
        """Whether a message is waiting (or the pipe was closed), after waiting up to `timeout` seconds for one."""
        readable = bool(self._readable.poll(max(timeout, 0.0) * 1000))
        if not readable and self._maybe_readable:
            self._maybe_readable = False
            self._watch_again.set()
        return readable

    def message_waiting(self) -> bool:
        """Whether a message may be waiting, read from the watcher's flag (no system call, the interpreter's lock
        kept): True from the moment one arrives until `poll` finds the pipe empty (a True can be stale: `poll` says)."""
        return self._maybe_readable

    def _watch(self) -> None:
        watched = select.poll()
        watched.register(self._connection.fileno(), select.POLLIN)
        while True:
            self._watch_again.wait()
            self._watch_again.clear()
            events = watched.poll()
            self._maybe_readable = True
            if any(event & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for _, event in events):
                return  # the supervisor closed the pipe: `poll` and `receive` say so from now on

    def fileno(self) -> int:
        """The pipe's descriptor: a pipeline rank waits on it together with its task connections."""
        return self._connection.fileno()
