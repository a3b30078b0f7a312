"""Several real exo nodes on 127.0.0.1 for cluster tests: separate processes, each with its own EXO_HOME, API port
and cluster port, joined by explicit peers (or by scouting, where asked).

Every node runs in a process group of its own (the node and its runner subprocesses), so a test can crash or freeze
a whole node at once, and `LocalCluster` kills every group it started on exit, whether or not the test passed.
"""

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Generator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from exo.shared.types.cluster_api import InstanceList, PlacedInstanceView
from exo.shared.types.worker.shards import Parallelism
from tests.exo_server import free_port, held_weights

T = TypeVar("T")

# Generous but bounded: starting Python, zenoh and a runner on a loaded 2-core machine takes seconds.
START_TIMEOUT_S = 120.0
SETTLE_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


@dataclass
class ClusterNode:
    name: str
    process: subprocess.Popen[bytes]
    api_port: int
    cluster_port: int
    home: Path
    log_path: Path
    models: tuple[Path, ...]
    arguments: list[str] = field(default_factory=list[str])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def endpoint(self) -> str:
        return f"tcp/127.0.0.1:{self.cluster_port}"

    @property
    def node_id(self) -> str:
        return (self.home / "node_id").read_text().strip()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str) -> Any:
        response = httpx.get(f"{self.base_url}{path}", timeout=10)
        response.raise_for_status()
        return response.json()

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = self.get("/state")
        return state

    def instances(self) -> InstanceList:
        return InstanceList.model_validate(self.get("/v1/cluster/instances"))

    def one_instance_ready(self) -> bool:
        """Exactly one instance is placed, and it is ready."""
        placed = self.instances().data
        return len(placed) == 1 and placed[0].ready

    def serving(self, world_size: int) -> PlacedInstanceView | None:
        """The one instance placed, if it is ready over `world_size` nodes (and nothing else is placed)."""
        placed = self.instances().data
        if len(placed) == 1 and placed[0].ready and placed[0].world_size == world_size:
            return placed[0]
        return None

    def running(self) -> bool:
        return self.process.poll() is None

    def signal_group(self, signum: signal.Signals) -> None:
        """Signal the node and its runners together, as when a machine dies or freezes."""
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)


class LocalCluster:
    """Starts nodes in `work_dir`; `stop_all` (also on exit) leaves no process behind."""

    def __init__(self, work_dir: Path, cluster_name: str) -> None:
        self.work_dir = work_dir
        self.cluster_name = cluster_name
        self.nodes: list[ClusterNode] = []

    def start(
        self,
        name: str,
        models: Sequence[Path] = (),
        peers: Sequence[ClusterNode] = (),
        *,
        home: Path | None = None,
        cluster_port: int | None = None,
        cluster_name: str | None = None,
        discovery: bool = False,
    ) -> ClusterNode:
        """Start a node and wait until it serves; see `launch`."""
        node = self.launch(
            name, models, peers, home=home, cluster_port=cluster_port, cluster_name=cluster_name, discovery=discovery
        )
        self.wait_ready(node)
        return node

    def wait_ready(self, node: ClusterNode) -> None:
        """Wait until `node` answers and its own runners are ready."""
        self.wait_until(node, lambda: _runners_ready(node), "its API and runners to come up", START_TIMEOUT_S)

    def launch(
        self,
        name: str,
        models: Sequence[Path] = (),
        peers: Sequence[ClusterNode] = (),
        *,
        home: Path | None = None,
        cluster_port: int | None = None,
        cluster_name: str | None = None,
        discovery: bool = False,
        extra_arguments: Sequence[str] = (),
    ) -> ClusterNode:
        """Start a node without waiting for it (no model when `models` is empty; `home` reuses an identity;
        `extra_arguments` go on its command line)."""
        api_port = free_port()
        cluster_port = cluster_port or free_port()
        home = home or self.work_dir / f"home-{name}"
        log_path = self.work_dir / f"{name}-{api_port}.log"
        arguments = [sys.executable, "-m", "exo", "--api-port", str(api_port), "--node-name", name]
        arguments += ["--listen", f"tcp/127.0.0.1:{cluster_port}", "--cluster", cluster_name or self.cluster_name]
        arguments += ["--models-dir", str(self.work_dir / f"models-{name}")]
        arguments += [argument for model in models for argument in ("--model", str(model))] or ["--no-model"]
        arguments += [argument for peer in peers for argument in ("--peer", peer.endpoint)]
        arguments += [] if discovery else ["--no-discovery"]
        arguments += held_weights(extra_arguments) + list(extra_arguments)
        environment = {**os.environ, "EXO_HOME": str(home)}
        environment.pop("EXO_PEERS", None)
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                arguments, stdout=log, stderr=subprocess.STDOUT, env=environment, start_new_session=True
            )
        node = ClusterNode(name, process, api_port, cluster_port, home, log_path, tuple(models), arguments)
        self.nodes.append(node)
        return node

    def launch_split(
        self, model: Path, parallel: Parallelism | None = None, both: Sequence[str] = ()
    ) -> tuple[ClusterNode, ClusterNode]:
        """alpha holds `model` and asks for it over two nodes (`--min-nodes 2`, split as `parallel` says when given);
        beta holds nothing and joins alpha; `both` go on both command lines. Neither is waited for."""
        arguments = ["--min-nodes", "2", *(["--parallel", parallel] if parallel is not None else []), *both]
        alpha = self.launch("alpha", [model], extra_arguments=arguments)
        return alpha, self.launch("beta", peers=[alpha], extra_arguments=both)

    def restart(self, node: ClusterNode, peers: Sequence[ClusterNode] = ()) -> ClusterNode:
        """Start `node` again with its identity (EXO_HOME) and cluster port."""
        return self.start(node.name, node.models, peers, home=node.home, cluster_port=node.cluster_port)

    def crash(self, node: ClusterNode) -> None:
        """SIGKILL the node and its runners: no goodbye to the cluster."""
        node.signal_group(signal.SIGKILL)
        node.process.wait(timeout=STOP_TIMEOUT_S)

    def stop(self, node: ClusterNode) -> None:
        """Ctrl-C, as an operator stops a node; killed if it does not exit in time."""
        if node.running():
            node.process.send_signal(signal.SIGINT)
            try:
                node.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                node.signal_group(signal.SIGKILL)
                node.process.wait()
        # Runners of a node that was killed outright are in its group too.
        node.signal_group(signal.SIGKILL)

    def stop_all(self) -> None:
        for node in self.nodes:
            node.signal_group(signal.SIGCONT)  # a frozen node cannot handle SIGINT
            self.stop(node)

    def wait_until(self, node: ClusterNode, condition: Callable[[], bool], what: str, timeout: float) -> None:
        """Poll `condition` until it holds; fail with every node's log tail after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not node.running():
                raise RuntimeError(f"{node.name} exited ({node.process.returncode}):\n{node.log()[-6000:]}")
            with suppress(httpx.HTTPError, KeyError, ValueError):
                if condition():
                    return
            time.sleep(0.1)
        raise TimeoutError(f"{node.name}: waited {timeout:.0f} s for {what}\n{self.logs()}")

    def wait_serving(self, node: ClusterNode, world_size: int, what: str, timeout: float) -> PlacedInstanceView:
        """Wait until `node` shows its one instance ready over `world_size` nodes, and return it."""
        self.wait_until(node, lambda: node.serving(world_size) is not None, what, timeout)
        instance = node.serving(world_size)
        assert instance is not None, f"{what}: served, then no longer"
        return instance

    def settled_states(self, nodes: Sequence[ClusterNode], timeout: float = SETTLE_TIMEOUT_S) -> dict[str, Any]:
        """Poll until every node in `nodes` returns the same /state document, and return it."""
        return self.agreed(nodes, lambda node: node.state(), "/state", timeout)

    def agreed(
        self,
        nodes: Sequence[ClusterNode],
        read: Callable[[ClusterNode], T],
        what: str,
        timeout: float = SETTLE_TIMEOUT_S,
    ) -> T:
        """Poll until `read` gives the same value on every node in `nodes`, and return it.

        Nodes publish their resources periodically, so a document that agreed a moment ago may be one event apart
        again when it is read node by node: agreement is judged on one round of reads, retried until it holds.
        """
        deadline = time.monotonic() + timeout
        values: list[T] = []
        while time.monotonic() < deadline:
            with suppress(httpx.HTTPError):
                values = [read(node) for node in nodes]
                if all(value == values[0] for value in values):
                    return values[0]
            time.sleep(0.1)
        shown = "\n".join(json.dumps(value, sort_keys=True, default=str)[:3000] for value in values)
        raise TimeoutError(f"{what} never converged on {[node.name for node in nodes]}:\n{shown}\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(f"--- {node.name} ---\n{node.log()[-4000:]}" for node in self.nodes)


def _runners_ready(node: ClusterNode) -> bool:
    """The API answers and every runner on this node is ready: at least one per model it holds, and any rank of a
    split model placed on it (a `--no-model` node that rejoins a split may have one before its API first answers)."""
    state = node.state()
    own = [runner for runner in state["runners"].values() if runner["node_id"] == node.node_id]
    return len(own) >= len(node.models) and all(runner["status"] == "ready" for runner in own)


@contextmanager
def local_cluster(work_dir: Path, cluster_name: str) -> Generator[LocalCluster]:
    cluster = LocalCluster(work_dir, cluster_name)
    try:
        yield cluster
    finally:
        cluster.stop_all()


def crash_mid_stream(
    cluster: LocalCluster, asked: ClusterNode, victim: ClusterNode, body: dict[str, Any]
) -> tuple[list[str], float]:
    """Stream `body` from `asked`, kill `victim` once text flows, and read the stream to its end: its data events
    and how long after the kill it ended."""
    with httpx.stream("POST", f"{asked.base_url}/v1/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        for line in lines:
            if '"content":"' in line and '"content":""' not in line:
                break  # every rank is generating
        cluster.crash(victim)
        killed_at = time.monotonic()
        events = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
        return events, time.monotonic() - killed_at
