"""Run a coding-agent CLI headless: its own session (so a timeout kills it and every child), stdin closed or given."""

import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict


class HeadlessOutput(BaseModel):
    """Exit status and output of one run; stderr says when the run was killed for taking too long."""

    model_config = ConfigDict(frozen=True)

    returncode: int
    stdout: str
    stderr: str


def run_headless(
    arguments: Sequence[str], project: Path, environment: dict[str, str], timeout: float, stdin_text: str | None = None
) -> HeadlessOutput:
    """Run `arguments` in `project` (also as $PWD, which some CLIs prefer to the real cwd), killed after `timeout` s;
    `stdin_text`, when given, is written to its stdin (otherwise stdin is closed).

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
    try:
        stdout, stderr = process.communicate(input=stdin_text, timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        stderr += f"\n[killed after {timeout:.0f}s]"
    return HeadlessOutput(returncode=process.returncode, stdout=stdout, stderr=stderr)
