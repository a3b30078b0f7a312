"""exo_add_peer and exo_discover: the two tools that change who is in the cluster."""

import time

import anyio
from pydantic import Field

from exo.mcp.failures import ToolFailedError
from exo.mcp.node_client import NodeApiError, NodeClient
from exo.shared.types.cluster_api import DiscoveryReport, PeerConnection
from exo.shared.types.common import FrozenModel

POLL_SECONDS = 0.5


class Discovery(FrozenModel):
    """What one scan found, and how many peers were up when the tool stopped waiting."""

    report: DiscoveryReport
    peers_up: int = Field(description="other nodes up in the cluster")
    wanted_peers: int
    waited_seconds: float


def describe_discovery(discovery: Discovery) -> str:
    """The peers found, and the peer count reached."""
    found = discovery.report.found
    lines = [f"The scan found {len(found)} node(s):" if found else "The scan found no node."]
    lines += [
        f"- {peer.node_id} at {', '.join(peer.endpoints) or 'no endpoint'}"
        + (" (joined)" if peer.joined else " (not in this cluster)")
        for peer in found
    ]
    lines.append(f"{discovery.peers_up} peer(s) up after {discovery.waited_seconds:.1f} s.")
    return "\n".join(lines)


def describe_peer(peer: PeerConnection) -> str:
    """Whether the node at the address joined."""
    if peer.joined:
        return f"Connected to {peer.endpoint}: node {peer.node_id} is in the cluster."
    return (
        f"{peer.endpoint} answered (node {peer.node_id}) but is not in this cluster: it runs another --cluster "
        "name, or is not an exo node."
    )


async def add_peer(client: NodeClient, address: str) -> PeerConnection:
    """Connect the node to another node's cluster endpoint; a bad address or a silent peer is a failure."""
    try:
        return await client.add_peer(address)
    except NodeApiError as error:
        if error.status_code == 502:
            raise ToolFailedError(
                f"{error} Is an exo node running there, listening on that cluster port (52414 unless --listen "
                "says otherwise)?"
            ) from error
        raise


async def _peers_up(client: NodeClient) -> int:
    summary = await client.cluster()
    return max(summary.nodes_healthy + summary.nodes_degraded - 1, 0)


async def discover(client: NodeClient, wait_for_peers: int, timeout_seconds: float) -> Discovery:
    """Scan once, then wait (at most `timeout_seconds`) until `wait_for_peers` other nodes are up."""
    started = time.monotonic()
    report = await client.discover()
    peers = await _peers_up(client)
    while peers < wait_for_peers and time.monotonic() - started < timeout_seconds:
        await anyio.sleep(POLL_SECONDS)
        peers = await _peers_up(client)
    discovery = Discovery(
        report=report, peers_up=peers, wanted_peers=wait_for_peers, waited_seconds=round(time.monotonic() - started, 2)
    )
    if peers < wait_for_peers:
        raise ToolFailedError(
            f"only {peers} of the {wait_for_peers} peer(s) wanted were up after {timeout_seconds:g} s. "
            "Nodes on other networks need exo_add_peer with their address.",
            partial=discovery,
        )
    return discovery
