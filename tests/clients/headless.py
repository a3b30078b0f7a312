"""Run a coding-agent CLI headless: its own session (so a timeout kills it and every child), stdin closed or given."""

import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict


class HeadlessOutput(BaseModel):
    """Exit status and output of one run; stderr says when the run was killed for taking too long."""

    model_config = ConfigDict(frozen=True)

    returncode: int
    stdout: str
    stderr: str


def run_headless(
    arguments: Sequence[str],
    project: Path,
    environment: dict[str, str],
    timeout: float,
    stdin_text: str | None = None,
    *,
    stop_when: Callable[[], bool] | None = None,
) -> HeadlessOutput:
    """Run `arguments` in `project` (also as $PWD, which some CLIs prefer to the real cwd), killed after `timeout` s,
    or as soon as `stop_when` (asked twice a second) says what the caller waits for has happened; `stdin_text`, when
    given, is written to its stdin (otherwise stdin is closed).

    Agents retry and compact on errors, so a misbehaving model can keep one busy forever.
    """
    process = subprocess.Popen(
        arguments,
        cwd=project,
        env=environment | {"PWD": str(project)},
        stdin=subprocess.DEVNULL if stdin_text is None else subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout
    pending_input = stdin_text
    while True:
        # communicate() keeps what it has read when it times out, and takes the input only on its first call.
        wait = deadline - time.monotonic() if stop_when is None else min(0.5, deadline - time.monotonic())
        try:
            stdout, stderr = process.communicate(input=pending_input, timeout=max(0.0, wait))
            return HeadlessOutput(returncode=process.returncode, stdout=stdout, stderr=stderr)
        except subprocess.TimeoutExpired:
            pending_input = None
            try:
                stopped = stop_when is not None and stop_when()
            except BaseException:
                os.killpg(process.pid, signal.SIGKILL)
                process.communicate()
                raise
            if stopped or time.monotonic() >= deadline:
                os.killpg(process.pid, signal.SIGKILL)
                stdout, stderr = process.communicate()
                reason = "stopped: what the test waits for happened" if stopped else f"killed after {timeout:.0f}s"
                return HeadlessOutput(returncode=process.returncode, stdout=stdout, stderr=stderr + f"\n[{reason}]")
