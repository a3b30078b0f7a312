"""What a node tells the cluster about itself: identity, addresses, hardware, MLX backend and CPU-kernel setting,
memory, version.

Read from the platform, psutil and installed package metadata; MLX is never imported here (the API process never
loads it), so the backend is read from which MLX wheel is installed.
"""

import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from exo.shared.local_backend import mlx_backend
from exo.shared.types.api_key import ApiKeyVerifier
from exo.shared.types.common import NodeId
from exo.shared.types.cpu_kernels import CpuKernelsSetting, NodeCpuWeights
from exo.shared.types.links import LinkMeasurement
from exo.shared.types.state import MlxBackend, NodeFacts, NodeMemory


def device_name() -> str:
    """The processor's marketing name and core count, e.g. `Apple M2 Max (12 cores)` or `AMD EPYC (2 cores)`."""
    name = platform.processor() or platform.machine()
    if sys.platform == "darwin":
        result = subprocess.run(
            ["/usr/sbin/sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, check=False
        )
        name = result.stdout.strip() or name
    elif os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as cpuinfo:
            models = [line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")]
        name = models[0] if models else name
    return f"{name} ({os.cpu_count() or 1} cores)"


def node_memory() -> NodeMemory:
    memory = psutil.virtual_memory()
    return NodeMemory(total_bytes=memory.total, available_bytes=memory.available)


def exo_version() -> str:
    try:
        return importlib.metadata.version("exo")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def reachable_endpoints(listen: tuple[str, ...]) -> tuple[str, ...]:
    """The listen endpoints as peers can dial them: a wildcard address becomes each interface's address."""
    endpoints: list[str] = []
    for endpoint in listen:
        wildcard = next((prefix for prefix in ("tcp/0.0.0.0:", "tcp/[::]:") if endpoint.startswith(prefix)), None)
        if wildcard is None:
            endpoints.append(endpoint)
            continue
        port = endpoint.removeprefix(wildcard)
        family = socket.AF_INET if "0.0.0.0" in wildcard else socket.AF_INET6
        for addresses in psutil.net_if_addrs().values():
            for address in addresses:
                host = address.address.split("%")[0]
                if address.family != family or host.startswith(("127.", "::1", "fe80")):
                    continue
                endpoints.append(f"tcp/{host}:{port}" if family == socket.AF_INET else f"tcp/[{host}]:{port}")
    return tuple(dict.fromkeys(endpoints))


@dataclass
class NodeDescriber:
    """Gathers the facts that never change once, and fresh memory figures on every call."""

    node_id: NodeId
    name: str
    listen: tuple[str, ...]
    api_port: int
    serves_models: bool
    # How many messages the node's bus has dropped so far (Bus.dropped_messages).
    dropped_messages: Callable[[], int] = lambda: 0
    # `--cpu-kernels`: published so placement plans the memory of what this node's runners load.
    cpu_kernels: CpuKernelsSetting = "auto"
    # `--cpu-weights` with `auto` resolved for this machine (`weights_choice.node_weights`): placement plans the size.
    cpu_weights: NodeCpuWeights = "float32"
    started_at: float = field(default_factory=time.time)
    # Published so that every node of the cluster requires a key once one node has one (api/cluster_keys.py).
    api_key_verifier: ApiKeyVerifier | None = None
    # The round trip to each peer (cluster/link_probe.py LinkProber.measurements).
    links: Callable[[], dict[NodeId, LinkMeasurement]] = dict[NodeId, LinkMeasurement]
    # Set once the node has measured it (cluster/memory_bandwidth.py), off the event loop, soon after it starts.
    memory_bandwidth: float | None = None
    _platform: str = field(default_factory=platform.platform)
    _device: str = field(default_factory=device_name)
    _backend: MlxBackend = field(default_factory=mlx_backend)
    _version: str = field(default_factory=exo_version)

    def __call__(self) -> NodeFacts:
        return NodeFacts(
            node_id=self.node_id,
            name=self.name,
            cluster_endpoints=reachable_endpoints(self.listen),
            api_port=self.api_port,
            platform=self._platform,
            device=self._device,
            mlx_backend=self._backend,
            memory=node_memory(),
            exo_version=self._version,
            serves_models=self.serves_models,
            started_at=self.started_at,
            dropped_messages=self.dropped_messages(),
            api_key_verifier=self.api_key_verifier,
            cpu_kernels=self.cpu_kernels,
            cpu_weights=self.cpu_weights,
            links=self.links(),
            memory_bandwidth_bytes_per_second=self.memory_bandwidth,
        )
