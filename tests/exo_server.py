"""Run a real `exo` node in a subprocess for end-to-end tests (real HTTP, real runner subprocess, real MLX)."""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Generator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from uuid import uuid4

import httpx
from anthropic import Anthropic
from openai import OpenAI

from tests.fixtures.fixture_specs import FIXTURE_MODELS_DIR, TEMPLATE_ORDER_FIXTURES
from tests.ports import free_port

__all__ = ["ExoServer", "fixture_model", "free_port", "running_exo"]


@dataclass
class ExoServer:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    api_key: str | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def openai_client(self) -> OpenAI:
        """The official SDK pointed at this server: no retries (a failure must show), generous time for CPU runs."""
        return OpenAI(base_url=f"{self.base_url}/v1", api_key="unused", max_retries=0, timeout=120)

    def anthropic_client(self) -> Anthropic:
        """The official Anthropic SDK pointed at this server (the Messages API), as strict as `openai_client`."""
        return Anthropic(base_url=self.base_url, api_key="unused", max_retries=0, timeout=120)

    def state(self) -> dict[str, object]:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        response = httpx.get(f"{self.base_url}/state", headers=headers, timeout=10)
        response.raise_for_status()
        state: dict[str, object] = response.json()
        return state

    def runners(self) -> list[dict[str, object]]:
        runners = self.state()["runners"]
        assert isinstance(runners, dict)
        return [runner for runner in runners.values() if isinstance(runner, dict)]  # pyright: ignore[reportUnknownVariableType, reportUnknownMemberType]

    def runner(self, model_id: str | None = None) -> dict[str, object]:
        """The runner serving `model_id` (or the only runner when there is one)."""
        runners = self.runners()
        if model_id is not None:
            runners = [runner for runner in runners if runner.get("model_id") == model_id]
        assert len(runners) == 1, runners
        return runners[0]

    def wait_for_status(
        self, wanted: str, timeout: float = 60.0, model_id: str | None = None, not_pid: int | None = None
    ) -> dict[str, object]:
        """The runner once its status is `wanted` (and, with `not_pid`, once it is no longer that process)."""
        deadline = time.monotonic() + timeout
        runner: dict[str, object] = {}
        while time.monotonic() < deadline:
            try:
                runner = self.runner(model_id)
                if runner.get("status") == wanted and (not_pid is None or runner.get("pid") != not_pid):
                    return runner
            except (httpx.HTTPError, AssertionError):
                pass
            if self.process.poll() is not None:
                raise RuntimeError(f"exo exited with {self.process.returncode}:\n{self.log()}")
            time.sleep(0.1)
        raise TimeoutError(f"runner never became {wanted!r} (last: {runner}):\n{self.log()}")

    def wait_until_all_ready(self, count: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        statuses: list[object] = []
        while time.monotonic() < deadline:
            try:
                statuses = [runner.get("status") for runner in self.runners()]
                if len(statuses) == count and all(status == "ready" for status in statuses):
                    return
            except httpx.HTTPError:
                pass
            if self.process.poll() is not None:
                raise RuntimeError(f"exo exited with {self.process.returncode}:\n{self.log()}")
            time.sleep(0.1)
        raise TimeoutError(f"runners never all became ready (last: {statuses}):\n{self.log()}")


def fixture_model(name: str) -> Path:
    return FIXTURE_MODELS_DIR / name


def isolation(home: Path) -> tuple[list[str], dict[str, str]]:
    """Arguments and environment that keep a test node to itself: its own EXO_HOME (identity), cluster port and
    cluster name, and no multicast scouting, so nodes of parallel tests (or a developer's own node) never meet."""
    arguments = ["--listen", f"tcp/127.0.0.1:{free_port()}", "--cluster", f"test-{uuid4().hex[:12]}", "--no-discovery"]
    return arguments, {"EXO_HOME": str(home)}


def held_weights(extra_args: Sequence[str]) -> list[str]:
    """`--cpu-weights float32` unless the test chooses its weights: these nodes' tests were written for float32, and
    the command line's default `auto` holds Q8_0 (or a kept GGUF) wherever ggml's library is built (CI builds it)."""
    return [] if any(argument.startswith("--cpu-weights") for argument in extra_args) else ["--cpu-weights", "float32"]


def trained_layout(models: Sequence[Path], extra_args: Sequence[str]) -> list[str]:
    """`--prompt-layout template` for a node serving a fixture trained on the template's order (unless the test
    chooses a layout itself): its prompts must stay the ones it was trained on."""
    chosen = any(argument.startswith("--prompt-layout") for argument in extra_args)
    trained = any(model.parent == FIXTURE_MODELS_DIR and model.name in TEMPLATE_ORDER_FIXTURES for model in models)
    return ["--prompt-layout", "template"] if trained and not chosen else []


@contextmanager
def running_exo(
    models: Sequence[Path],
    tmp_path: Path,
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    *,
    ready_timeout: float = 60.0,
    api_key: str | None = None,
) -> Generator[ExoServer]:
    """Start `python -m exo` on a free port serving `models` (behind `api_key` when given), wait until ready, and
    stop it afterwards."""
    port = free_port()
    log_path = tmp_path / f"exo-{port}.log"
    arguments = [sys.executable, "-m", "exo", "--api-port", str(port), "--models-dir", str(tmp_path / "models")]
    for model in models:
        arguments += ["--model", str(model)]
    isolating_arguments, isolating_env = isolation(tmp_path / f"home-{port}")
    arguments += isolating_arguments + held_weights(extra_args) + list(extra_args)
    arguments += trained_layout(models, extra_args)
    if api_key is not None:
        arguments += ["--api-key", api_key]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            arguments,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **isolating_env, **(env or {})},
            start_new_session=True,
        )
    server = ExoServer(process=process, port=port, log_path=log_path, api_key=api_key)
    try:
        server.wait_until_all_ready(len(models), timeout=ready_timeout)
        yield server
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
