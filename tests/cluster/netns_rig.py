"""A cluster test rig on real (virtual) networks: every node a real exo process in its own Linux network namespace.

The rig creates one namespace holding a bridge (`br0`, 10.77.0.254/24, multicast snooping off so zenoh's scouting
crosses it) and, per node, a namespace whose `eth0` is one end of a veth pair; the other end is a port of the
bridge. Addresses are the rig's own (10.77.0.N), inside namespaces it created: the host's network is never touched.
Faults:

- a partition: the node's bridge port is taken down (`cut`), and brought up again (`heal`);
- a bandwidth limit: a `tc` token-bucket filter on the node's `eth0` (`limit_bandwidth`);
- a sleeping machine: SIGSTOP to the node's process group (`sleep` / `wake`).

The test process reaches each node's API from a thread that entered that node's namespace (`setns`), so a test can
still ask a node cut off from the others. Everything is removed on `close()` (namespaces, and with them the
veths and the bridge), also after a failure. Needs root (CAP_NET_ADMIN); `NetnsRig.unavailable()` says why not.
"""

import contextlib
import ctypes
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from tests.exo_server import held_weights

T = TypeVar("T")

SUBNET = "10.77.0"
BRIDGE_ADDRESS = f"{SUBNET}.254"
API_PORT = 52415
CLUSTER_PORT = 52414
CLONE_NEWNET = 0x40000000
STOP_TIMEOUT_S = 15.0


def _ip(*arguments: str) -> None:
    subprocess.run(["ip", *arguments], check=True, capture_output=True, text=True)


@dataclass
class RigNode:
    name: str
    index: int
    namespace: str
    bridge_port: str
    home: Path
    log_path: Path
    models: tuple[Path, ...]
    process: subprocess.Popen[bytes] | None = None
    arguments: list[str] = field(default_factory=list[str])
    # A node with no link to the bridge (reached only through a proxy) listens on its loopback...
    isolated: bool = False
    # ...or on the address it holds on a link of its own (tun_link.py), when it has one.
    link_address: str | None = None

    @property
    def address(self) -> str:
        if self.link_address is not None:
            return self.link_address
        return "127.0.0.1" if self.isolated else f"{SUBNET}.{self.index}"

    @property
    def base_url(self) -> str:
        return f"http://{self.address}:{API_PORT}"

    @property
    def endpoint(self) -> str:
        return f"tcp/{self.address}:{CLUSTER_PORT}"

    @property
    def node_id(self) -> str:
        return (self.home / "node_id").read_text().strip()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal_group(self, signum: signal.Signals) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signum)


class NetnsRig:
    def __init__(self, work_dir: Path, cluster_name: str) -> None:
        self.work_dir = work_dir
        self.cluster_name = cluster_name
        self.prefix = f"exorig{secrets.token_hex(3)}"
        self.bridge_namespace = f"{self.prefix}-br"
        self.nodes: list[RigNode] = []
        self._namespaces: list[str] = []
        # One client thread per node, inside the node's namespace.
        self._clients: dict[str, ThreadPoolExecutor] = {}

    @staticmethod
    def unavailable() -> str | None:
        """Why network namespaces cannot be made here (None: they can)."""
        if sys.platform != "linux":
            return "network namespaces are Linux only"
        probe = f"exoprobe{secrets.token_hex(3)}"
        result = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            return f"cannot create a network namespace (`ip netns add` needs root): {result.stderr.strip()}"
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
        return None

    # ---- the network ------------------------------------------------------------------------------

    def create(self) -> None:
        self._add_namespace(self.bridge_namespace)
        bridge = ("-n", self.bridge_namespace)
        _ip(*bridge, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0")
        _ip(*bridge, "addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", "br0")
        _ip(*bridge, "link", "set", "br0", "up")

    def add_node(self, name: str, models: Sequence[Path] = (), *, isolated: bool = False) -> RigNode:
        """A node's namespace, linked to the bridge (or, `isolated`, with loopback only: a proxy is its way out)."""
        index = len(self.nodes) + 1
        namespace = f"{self.prefix}-{name}"
        self._add_namespace(namespace)
        if isolated:
            return self._register(
                RigNode(
                    name=name,
                    index=index,
                    namespace=namespace,
                    bridge_port="",
                    home=self.work_dir / f"home-{name}",
                    log_path=self.work_dir / f"{name}.log",
                    models=tuple(models),
                    isolated=True,
                )
            )
        port = f"{self.prefix[-6:]}p{index}"
        _ip(
            "-n", namespace, "link", "add", "eth0", "type", "veth", "peer", "name", port, "netns", self.bridge_namespace
        )
        _ip("-n", self.bridge_namespace, "link", "set", port, "master", "br0", "up")
        _ip("-n", namespace, "addr", "add", f"{SUBNET}.{index}/24", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        # Multicast (zenoh's scouting) leaves by eth0: without a route for it the kernel refuses to send.
        _ip("-n", namespace, "route", "add", "224.0.0.0/4", "dev", "eth0")
        node = RigNode(
            name=name,
            index=index,
            namespace=namespace,
            bridge_port=port,
            home=self.work_dir / f"home-{name}",
            log_path=self.work_dir / f"{name}.log",
            models=tuple(models),
        )
        return self._register(node)

    def _register(self, node: RigNode) -> RigNode:
        self.nodes.append(node)
        self._clients[node.name] = ThreadPoolExecutor(
            max_workers=1, initializer=enter_namespace, initargs=(node.namespace,)
        )
        return node

    def cut(self, *nodes: RigNode) -> None:
        """Partition: each node's link to the bridge goes down (nothing in or out)."""
        for node in nodes:
            _ip("-n", self.bridge_namespace, "link", "set", node.bridge_port, "down")

    def heal(self, *nodes: RigNode) -> None:
        for node in nodes:
            _ip("-n", self.bridge_namespace, "link", "set", node.bridge_port, "up")

    def limit_bandwidth(self, node: RigNode, rate: str = "10mbit") -> None:
        """A token-bucket filter on the node's outgoing traffic (`tc ... tbf`)."""
        subprocess.run(
            ["ip", "netns", "exec", node.namespace, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf",
             "rate", rate, "burst", "32kbit", "latency", "400ms"],
            check=True,
            capture_output=True,
        )  # fmt: skip

    # ---- nodes ------------------------------------------------------------------------------------

    def start(self, node: RigNode, extra_arguments: Sequence[str] = ()) -> RigNode:
        """Start exo in the node's namespace (discovery by multicast on; no --peer unless given)."""
        arguments = ["ip", "netns", "exec", node.namespace, sys.executable, "-m", "exo"]
        arguments += ["--host", node.address, "--api-port", str(API_PORT), "--node-name", node.name]
        arguments += ["--listen", node.endpoint, "--cluster", self.cluster_name]
        arguments += ["--models-dir", str(self.work_dir / f"models-{node.name}")]
        arguments += [argument for model in node.models for argument in ("--model", str(model))] or ["--no-model"]
        arguments += held_weights(extra_arguments) + list(extra_arguments)
        environment = {**os.environ, "EXO_HOME": str(node.home)}
        environment.pop("EXO_PEERS", None)
        with node.log_path.open("ab") as log:
            node.process = subprocess.Popen(
                arguments, stdout=log, stderr=subprocess.STDOUT, env=environment, start_new_session=True
            )
        node.arguments = arguments
        return node

    def stop(self, node: RigNode) -> None:
        if node.process is None:
            return
        node.signal_group(signal.SIGCONT)
        if node.running():
            node.process.send_signal(signal.SIGINT)
            try:
                node.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                node.signal_group(signal.SIGKILL)
                node.process.wait()
        node.signal_group(signal.SIGKILL)

    def sleep(self, node: RigNode) -> None:
        """The machine sleeps: every process of the node stops where it is."""
        node.signal_group(signal.SIGSTOP)

    def wake(self, node: RigNode) -> None:
        node.signal_group(signal.SIGCONT)

    # ---- talking to nodes -------------------------------------------------------------------------

    def call(self, node: RigNode, function: Callable[[], T]) -> T:
        """Run `function` in a thread inside `node`'s namespace (its API answers there even when it is cut off)."""
        return self._clients[node.name].submit(function).result()

    def get(self, node: RigNode, path: str, timeout: float = 10.0) -> Any:
        def fetch() -> Any:
            response = httpx.get(f"{node.base_url}{path}", timeout=timeout)
            response.raise_for_status()
            return response.json()

        return self.call(node, fetch)

    def post(self, node: RigNode, path: str, body: dict[str, Any], timeout: float = 30.0) -> httpx.Response:
        return self.call(node, lambda: httpx.post(f"{node.base_url}{path}", json=body, timeout=timeout))

    def wait_until(self, condition: Callable[[], bool], what: str, timeout: float) -> float:
        """Poll `condition` until it holds and return how long that took; fail with every log after `timeout`."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                if condition():
                    return time.monotonic() - started
            time.sleep(0.2)
        raise TimeoutError(f"waited {timeout:.0f} s for {what}\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(f"--- {node.name} ---\n{node.log()[-4000:]}" for node in self.nodes if node.log_path.exists())

    # ---- set-up and clean-up ----------------------------------------------------------------------

    def close(self) -> None:
        """Stop every node and delete every namespace the rig made (and with them its links)."""
        for node in self.nodes:
            with contextlib.suppress(Exception):
                self.stop(node)
        for client in self._clients.values():
            client.shutdown(wait=False, cancel_futures=True)
        for namespace in reversed(self._namespaces):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)
        self._namespaces.clear()

    def _add_namespace(self, namespace: str) -> None:
        _ip("netns", "add", namespace)
        self._namespaces.append(namespace)
        _ip("-n", namespace, "link", "set", "lo", "up")


def enter_namespace(namespace: str) -> None:
    """Move the calling thread (only it: network namespaces are per thread) into `namespace`."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open(f"/var/run/netns/{namespace}") as handle:
        if libc.setns(handle.fileno(), CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {namespace} failed")
