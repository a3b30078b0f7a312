"""How a node joins its cluster: namespace, where it listens, whom it dials, whether it scouts, as a zenoh config."""

import functools
import hashlib
import hmac
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import zenoh

from exo.shared.types.common import NodeId

DEFAULT_CLUSTER_NAME = "default"
DEFAULT_CLUSTER_PORT = 52414
# exo's own multicast group port, so scouting finds exo nodes and not every zenoh application on the LAN.
MULTICAST_ADDRESS = "224.0.0.224:52413"
# A node that stops answering is dropped after this long (zenoh's transport lease); well inside the 10 s promise.
LEASE_MILLISECONDS = 6000

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
_CLUSTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")
_ENDPOINT = re.compile(r"^tcp/(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(?P<port>[0-9]{1,5})$")


class ClusterSettingsError(ValueError):
    """A cluster flag or EXO_PEERS entry is malformed."""


def check_cluster_name(name: str) -> str:
    if not _CLUSTER_NAME.match(name):
        raise ClusterSettingsError(
            f"cluster name {name!r} must be 1-63 letters, digits, '-' or '_', starting with a letter or digit"
        )
    return name


def normalise_endpoint(text: str) -> str:
    """`tcp/HOST:PORT` as zenoh takes it; a bare `HOST:PORT` is read as TCP."""
    endpoint = text.strip()
    if "/" not in endpoint:
        endpoint = f"tcp/{endpoint}"
    match = _ENDPOINT.match(endpoint)
    if match is None or not 0 < int(match["port"]) < 65536:
        raise ClusterSettingsError(
            f"{text!r} is not a cluster endpoint: expected tcp/HOST:PORT (e.g. tcp/10.0.0.2:52414)"
        )
    return endpoint


def parse_peer_list(text: str) -> tuple[str, ...]:
    """EXO_PEERS: endpoints separated by commas or whitespace."""
    return tuple(normalise_endpoint(part) for part in re.split(r"[,\s]+", text) if part)


def default_listen_endpoint(host: str) -> str:
    """Loopback when the API is loopback-only (the node stays private); every interface otherwise."""
    if host in LOOPBACK_HOSTS:
        return f"tcp/127.0.0.1:{DEFAULT_CLUSTER_PORT}"
    return f"tcp/0.0.0.0:{DEFAULT_CLUSTER_PORT}"


def loopback_interface() -> str | None:
    """The name of the interface holding 127.0.0.1 (`lo` on Linux, `lo0` on macOS)."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(address.address == "127.0.0.1" for address in addresses):
            return name
    return None


@dataclass(frozen=True)
class ClusterSettings:
    name: str = DEFAULT_CLUSTER_NAME
    # Empty: no listener (an in-process node that only talks to itself, as unit tests use).
    listen: tuple[str, ...] = (f"tcp/127.0.0.1:{DEFAULT_CLUSTER_PORT}",)
    peers: tuple[str, ...] = ()
    # Multicast scouting: nodes on one LAN (or, for a loopback node, one machine) find each other unasked.
    discovery: bool = True
    # The cluster key (--cluster-key / EXO_CLUSTER_KEY): only sessions that prove they hold it may link. Never shown.
    key: str | None = field(default=None, repr=False)

    @property
    def reachable_from_network(self) -> bool:
        """Some listener accepts connections from other machines."""
        return any("/127." not in endpoint and "/[::1]" not in endpoint for endpoint in self.listen)

    def multicast_interface(self) -> str:
        """Scout on the loopback interface for a loopback node, so it never advertises 127.0.0.1 to the LAN."""
        if self.listen and not self.reachable_from_network:
            return loopback_interface() or "auto"
        return "auto"


MIN_KEY_LENGTH = 16


def check_cluster_key(key: str) -> str:
    if len(key) < MIN_KEY_LENGTH:
        raise ClusterSettingsError(f"the cluster key must be at least {MIN_KEY_LENGTH} characters long")
    return key


@functools.cache
def _dictionary_file(user: str, password: str) -> Path:
    """zenoh reads the credentials it accepts from a file: one, private to this process's user."""
    directory = Path(tempfile.mkdtemp(prefix="exo-cluster-auth-"))
    path = directory / "credentials"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(f"{user}:{password}\n")
    return path


def authentication(settings: ClusterSettings) -> dict[str, str] | None:
    """zenoh's user-password authentication for a keyed cluster: every link's two ends prove they hold the same
    credentials (derived from the key and the cluster's name, so the key itself is never written anywhere)."""
    if settings.key is None:
        return None
    user = f"exo-{settings.name}"
    password = hmac.new(settings.key.encode(), f"exo cluster {settings.name}".encode(), hashlib.sha256).hexdigest()
    return {"user": user, "password": password, "dictionary_file": str(_dictionary_file(user, password))}


def apply_authentication(config: zenoh.Config, settings: ClusterSettings) -> None:
    credentials = authentication(settings)
    if credentials is not None:
        config.insert_json5("transport/auth/usrpwd", json.dumps(credentials))


def zenoh_config(settings: ClusterSettings, node_id: NodeId, *, discovery: bool | None = None) -> zenoh.Config:
    """The zenoh session config for this node: a peer whose zenoh id is the node id (stable across restarts)."""
    scouting = settings.discovery if discovery is None else discovery
    config = zenoh.Config()
    config.insert_json5("mode", json.dumps("peer"))
    config.insert_json5("id", json.dumps(node_id))
    config.insert_json5("listen/endpoints", json.dumps(list(settings.listen)))
    config.insert_json5("connect/endpoints", json.dumps(list(settings.peers)))
    config.insert_json5("scouting/multicast/enabled", json.dumps(scouting))
    config.insert_json5("scouting/multicast/address", json.dumps(MULTICAST_ADDRESS))
    config.insert_json5("scouting/multicast/interface", json.dumps(settings.multicast_interface()))
    config.insert_json5("transport/link/tx/lease", json.dumps(LEASE_MILLISECONDS))
    apply_authentication(config, settings)
    return config
