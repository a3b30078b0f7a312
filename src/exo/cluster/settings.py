"""How a node joins its cluster: namespace, where it listens, whom it dials, whether it scouts, as a zenoh config."""

import json
import re
from dataclasses import dataclass, field

import psutil
import zenoh

from exo.cluster.cluster_tls import tls_link_config
from exo.shared.errors import ClusterSettingsError
from exo.shared.types.common import NodeId

DEFAULT_CLUSTER_NAME = "default"
DEFAULT_CLUSTER_PORT = 52414
# exo's own multicast group port, so scouting finds exo nodes and not every zenoh application on the LAN.
MULTICAST_ADDRESS = "224.0.0.224:52413"
# A node that stops answering is dropped after this long (zenoh's transport lease); well inside the 10 s promise.
LEASE_MILLISECONDS = 6000
ONE_DIALLER_PER_PAIR = {"to_router": "always", "to_peer": "greater-zid"}

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
_CLUSTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")
_ENDPOINT = re.compile(r"^tcp/(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(?P<port>[0-9]{1,5})$")


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
    # The cluster key (--cluster-key / EXO_CLUSTER_KEY): links are mutual TLS rooted in it. Never shown.
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
    """The key as given, or ClusterSettingsError when it cannot guard a cluster: shorter than MIN_KEY_LENGTH once
    blanks are left out (an empty or blank key is the most likely slip: an unset variable in a script), or with
    blanks around it (nodes given it quoted and unquoted would hold different keys and never link)."""
    if len(key.strip()) < MIN_KEY_LENGTH:
        given = "empty" if not key else "blank" if not key.strip() else f"{len(key.strip())} characters"
        raise ClusterSettingsError(
            f"the cluster key must be at least {MIN_KEY_LENGTH} characters long, not counting blanks (it is {given})"
        )
    if key != key.strip():
        raise ClusterSettingsError("the cluster key starts or ends with blanks: give it without them on every node")
    if any(not character.isprintable() for character in key):
        raise ClusterSettingsError("the cluster key holds control characters: use printable characters only")
    return key


def link_endpoint(endpoint: str, settings: ClusterSettings) -> str:
    """The endpoint as zenoh dials or binds it: a keyed cluster's links are TLS on the same host and port."""
    if settings.key is not None and endpoint.startswith("tcp/"):
        return "tls/" + endpoint.removeprefix("tcp/")
    return endpoint


def apply_cluster_key(config: zenoh.Config, settings: ClusterSettings) -> None:
    """A keyed cluster links over mutual TLS only (see cluster_tls): no plain TCP link, in or out."""
    if settings.key is None:
        return
    config.insert_json5("transport/link/protocols", json.dumps(["tls"]))
    config.insert_json5("transport/link/tls", tls_link_config(settings.key, settings.name).model_dump_json())


def zenoh_config(settings: ClusterSettings, node_id: NodeId, *, discovery: bool | None = None) -> zenoh.Config:
    """The zenoh session config for this node: a peer whose zenoh id is the node id (stable across restarts)."""
    scouting = settings.discovery if discovery is None else discovery
    config = zenoh.Config()
    config.insert_json5("mode", json.dumps("peer"))
    config.insert_json5("id", json.dumps(node_id))
    config.insert_json5("listen/endpoints", json.dumps([link_endpoint(item, settings) for item in settings.listen]))
    config.insert_json5("connect/endpoints", json.dumps([link_endpoint(item, settings) for item in settings.peers]))
    config.insert_json5("scouting/multicast/enabled", json.dumps(scouting))
    config.insert_json5("scouting/multicast/address", json.dumps(MULTICAST_ADDRESS))
    config.insert_json5("scouting/multicast/interface", json.dumps(settings.multicast_interface()))
    config.insert_json5("transport/link/tx/lease", json.dumps(LEASE_MILLISECONDS))
    # Of two peers that find each other, only the one with the smaller id dials. When both dial at once, zenoh can
    # keep both links in one transport, and when such a peer is cut off, the expiry of its first link held up
    # everything a third node received from the new master for 10 s (it was passed over as silent): see
    # docs/CLUSTER.md, "A master cut off".
    for scouting in ("multicast", "gossip"):
        config.insert_json5(f"scouting/{scouting}/autoconnect_strategy", json.dumps({"peer": ONE_DIALLER_PER_PAIR}))
    apply_cluster_key(config, settings)
    return config
