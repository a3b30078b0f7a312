"""Lifecycle of a runner: loading → ready ⇄ running → failed / shutdown."""

from typing import Literal

RunnerStatus = Literal["loading", "ready", "running", "failed", "shutdown"]
