"""Start one model over N real exo nodes on 127.0.0.1 (explicit peers, no scouting) and always stop them all.

The first node holds the model and is started with `--min-nodes N`; the others load nothing and copy their layers'
files from it. Each node runs in a session of its own (with its runner subprocesses), so stopping kills the group.
`RunningNodes.cpu_seconds` is the CPU time the nodes and their runners have used so far, so a caller can tell how
many cores a measurement kept busy.
"""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Generator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from bench.servers import free_port, with_weights
from exo.shared.types.cluster_api import InstanceList
from exo.shared.types.state import State

PLACED_TIMEOUT_S = 900.0
STOP_TIMEOUT_S = 20.0


def _launch(
    work_dir: Path, name: str, cluster: str, model_arguments: list[str], peer: str | None
) -> tuple[subprocess.Popen[bytes], str, str]:
    """Start a node; returns the process, its API URL and its cluster endpoint."""
    api_port, cluster_port = free_port(), free_port()
    endpoint = f"tcp/127.0.0.1:{cluster_port}"
    arguments = [sys.executable, "-m", "exo", "--api-port", str(api_port), "--node-name", name]
    arguments += ["--listen", endpoint, "--cluster", cluster, "--no-discovery"]
    arguments += ["--models-dir", str(work_dir / f"models-{name}"), *with_weights(model_arguments)]
    arguments += ["--peer", peer] if peer else []
    environment = {**os.environ, "EXO_HOME": str(work_dir / f"home-{name}")}
    environment.pop("EXO_PEERS", None)
    with (work_dir / f"{name}.log").open("wb") as log:
        process = subprocess.Popen(
            arguments, stdout=log, stderr=subprocess.STDOUT, env=environment, start_new_session=True
        )
    return process, f"http://127.0.0.1:{api_port}", endpoint


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        with suppress(subprocess.TimeoutExpired):
            process.wait(timeout=STOP_TIMEOUT_S)
    # The node's runners are in its session's group, also when the node itself already exited.
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _placed(base_url: str, nodes: int) -> bool:
    """A split model is ready when its placed instance is; a whole one (one node) when its runner is."""
    if nodes == 1:
        response = httpx.get(f"{base_url}/state", timeout=10)
        response.raise_for_status()
        runners = State.model_validate(response.json()).runners.values()
        return len(runners) == 1 and all(runner.status == "ready" for runner in runners)
    response = httpx.get(f"{base_url}/v1/cluster/instances", timeout=10)
    response.raise_for_status()
    instances = InstanceList.model_validate(response.json()).data
    return len(instances) == 1 and instances[0].world_size == nodes and instances[0].ready


def _wait_placed(processes: list[subprocess.Popen[bytes]], base_url: str, nodes: int, work_dir: Path) -> None:
    deadline = time.monotonic() + PLACED_TIMEOUT_S
    while time.monotonic() < deadline:
        exited = [process for process in processes if process.poll() is not None]
        if exited:
            raise RuntimeError(f"an exo node exited ({exited[0].returncode}); logs in {work_dir}")
        with suppress(httpx.HTTPError):
            if _placed(base_url, nodes):
                return
        time.sleep(0.5)
    raise TimeoutError(
        f"the model was not ready over {nodes} node(s) after {PLACED_TIMEOUT_S:.0f} s; logs in {work_dir}"
    )


def _tree_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its living descendants (the node and its runners)."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for process in processes:
        with suppress(psutil.NoSuchProcess):
            times = process.cpu_times()
            total += times.user + times.system
    return total


@dataclass(frozen=True)
class RunningNodes:
    base_url: str
    """The first node's API."""
    pids: tuple[int, ...]

    def cpu_seconds(self) -> float:
        """CPU time every node and runner has used so far; the difference over a measurement, divided by its wall
        time, is how many cores it kept busy (only processes alive at both readings count: runners stay up)."""
        return sum(_tree_cpu_seconds(pid) for pid in self.pids)


@contextmanager
def model_over_nodes(model_path: Path, nodes: int, work_dir: Path) -> Generator[RunningNodes]:
    """Serve `model_path` split over `nodes` local nodes; yields them once the instance is ready (its API is the
    first node's); every node is stopped on exit."""
    cluster = f"bench-pipeline-{nodes}-{os.getpid()}"
    processes: list[subprocess.Popen[bytes]] = []
    try:
        first, base_url, endpoint = _launch(
            work_dir, "node-1", cluster, ["--model", str(model_path), "--min-nodes", str(nodes)], None
        )
        processes.append(first)
        for index in range(2, nodes + 1):
            processes.append(_launch(work_dir, f"node-{index}", cluster, ["--no-model"], endpoint)[0])
        _wait_placed(processes, base_url, nodes, work_dir)
        yield RunningNodes(base_url=base_url, pids=tuple(process.pid for process in processes))
    finally:
        for process in processes:
            _stop(process)
