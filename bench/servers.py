"""Start the servers under test as real subprocesses, wait until they can serve, and always stop them."""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Generator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from exo.shared.loopback_ports import free_loopback_port as free_port
from exo.shared.types.state import State
from exo.worker.engines.mlx.cpu.blas import blas_environment
from exo.worker.engines.mlx.cpu.ggml_locate import GGML_DIR_VARIABLE, find_ggml_library

STARTUP_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class RunningServer:
    name: str
    base_url: str
    log_path: Path
    pid: int | None = None
    """The server's process (the root of its process tree: exo's runners are its children)."""


PLAN_REFINED = "matmul plan refined while idle"
"""What an exo runner logs once it has refined its matmul plan (`exo.worker.runner.runner`)."""


def _exo_ready(base_url: str, log_path: Path) -> bool:
    """Every runner loaded, and done refining its matmul plan: a runner refines it while idle, which in the bench is
    while another system is being measured, so measuring starts once that is over (a minute or so)."""
    response = httpx.get(f"{base_url}/state", timeout=10)
    response.raise_for_status()
    runners = State.model_validate(response.json()).runners.values()
    if any(runner.status == "failed" for runner in runners):
        raise RuntimeError("the exo runner failed to load the model")
    if not runners or any(runner.status != "ready" for runner in runners):
        return False
    planned = sum(runner.metadata is not None and runner.metadata.matmul_plan is not None for runner in runners)
    return log_path.read_text(errors="replace").count(PLAN_REFINED) >= planned


def _mlx_lm_ready(base_url: str, _: Path) -> bool:
    return httpx.get(f"{base_url}/health", timeout=10).status_code == 200


def _wait(process: subprocess.Popen[bytes], log_path: Path, ready: Callable[[], bool]) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}; log {log_path}:\n{_tail(log_path)}")
        try:
            if ready():
                return
        except httpx.HTTPError:
            pass  # not listening yet
        time.sleep(0.25)
    raise TimeoutError(f"server not ready after {STARTUP_TIMEOUT_S:.0f} s; log {log_path}:\n{_tail(log_path)}")


def _tail(log_path: Path) -> str:
    return log_path.read_text(errors="replace")[-4000:]


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        # The server started its own process group (start_new_session): kill it with its runner children.
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@contextmanager
def serving(
    *,
    name: str,
    arguments: list[str],
    env: dict[str, str],
    log_dir: Path,
    port: int,
    ready: Callable[[str, Path], bool],
) -> Generator[RunningServer]:
    log_path = log_dir / f"{'-'.join(name.split())}-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(arguments, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base_url = f"http://127.0.0.1:{port}"
    try:
        _wait(process, log_path, lambda: ready(base_url, log_path))
        yield RunningServer(name=name, base_url=base_url, log_path=log_path, pid=process.pid)
    finally:
        _stop(process)


FLOAT32_WEIGHTS = ("--cpu-weights", "float32")
"""What every published `exo` figure was measured with before `--cpu-weights auto` (Q8_0 or the kept GGUF where ggml
is built) became the default: a run that does not choose its weights keeps these, so a table's `exo` stays float32."""


def with_weights(flags: Sequence[str]) -> list[str]:
    """`flags`, plus `--cpu-weights float32` unless they choose the weights."""
    chosen = any(flag.startswith("--cpu-weights") for flag in flags)
    return list(flags) if chosen else [*flags, *FLOAT32_WEIGHTS]


@contextmanager
def running_exo(
    model_path: Path, work_dir: Path, flags: Sequence[str] = (), name: str = "exo", home: Path | None = None
) -> Generator[RunningServer]:
    """`python -m exo [flags]` serving `model_path` on a free port, with a scratch models dir; stopped on exit.

    `home` is its `EXO_HOME` (a fresh one in `work_dir` when None): the same one again is a restart."""
    port = free_port()
    arguments = [sys.executable, "-m", "exo", "--api-port", str(port), "--model", str(model_path), *with_weights(flags)]
    arguments += ["--models-dir", str(work_dir / "exo-models")]
    # A node of its own (identity, cluster port and name, no scouting), so a node the user runs never joins in.
    arguments += ["--listen", f"tcp/127.0.0.1:{free_port()}", "--cluster", f"bench-{port}", "--no-discovery"]
    # exo sets up its BLAS preload itself; it gets the caller's environment otherwise unchanged, as a user would.
    environment = {**os.environ, "EXO_HOME": str(home or work_dir / f"exo-home-{port}")}
    environment.update(_ggml_of_the_caller())
    with serving(
        name=name, arguments=arguments, env=environment, log_dir=work_dir, port=port, ready=_exo_ready
    ) as server:
        yield server


def _ggml_of_the_caller() -> dict[str, str]:
    """`EXO_GGML_DIR` naming the ggml build the caller's own node would load (`exo ggml build`'s, in the caller's
    `EXO_HOME`), where it has one and names none itself: a server's fresh `EXO_HOME` holds no ggml build, and
    without this it would load the bench's llama-server build, which lacks exo's multi-row kernel."""
    if os.environ.get(GGML_DIR_VARIABLE):
        return {}
    folder = find_ggml_library()
    return {} if folder is None else {GGML_DIR_VARIABLE: str(folder)}


@contextmanager
def running_mlx_lm_server(model_path: Path, work_dir: Path) -> Generator[RunningServer]:
    """`python -m mlx_lm server` serving `model_path` with the BLAS preload exo's runner gets; stopped on exit."""
    port = free_port()
    arguments = [sys.executable, "-m", "mlx_lm", "server", "--model", str(model_path), "--port", str(port)]
    arguments += ["--log-level", "WARNING"]
    environment = blas_environment(os.environ)
    # mlx_lm.server reads the Hugging Face cache for /v1/models; point it at an existing, empty folder.
    hub_cache = work_dir / "hf-cache"
    hub_cache.mkdir(exist_ok=True)
    environment["HF_HUB_CACHE"] = str(hub_cache)
    environment["HF_HUB_OFFLINE"] = "1"
    with serving(
        name="mlx_lm.server", arguments=arguments, env=environment, log_dir=work_dir, port=port, ready=_mlx_lm_ready
    ) as server:
        yield server
