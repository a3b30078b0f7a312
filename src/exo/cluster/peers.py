"""Adding peers while a node runs (POST /v1/cluster/peers) and scanning the LAN again (POST /v1/cluster/discover).

A zenoh session cannot dial a new endpoint after it opened, so the node introduces itself instead: a short-lived
helper session connects to both this node and the new endpoint, zenoh's gossip tells each side where the other
listens, and the two connect directly; then the helper closes. Peers added this way are re-introduced if the link
drops, until the node stops (`--peer`/EXO_PEERS are the ones that survive a restart).
"""

import json
import logging
import time

import anyio
import anyio.to_thread
import zenoh

from exo.cluster.bus import Bus
from exo.cluster.membership import Membership
from exo.cluster.settings import ClusterSettings, apply_cluster_key, link_endpoint, normalise_endpoint, zenoh_config
from exo.shared.errors import PeerUnreachableError
from exo.shared.types.cluster_api import DiscoveredPeer, DiscoveryReport, PeerConnection
from exo.shared.types.common import NodeId

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_MILLISECONDS = 3000
LINK_WAIT_SECONDS = 5.0
MEMBER_WAIT_SECONDS = 5.0
SCOUT_SECONDS = 2.0
RECONNECT_INTERVAL_SECONDS = 10.0


class PeerConnector:
    def __init__(self, bus: Bus, settings: ClusterSettings, membership: Membership) -> None:
        self._bus = bus
        self._settings = settings
        self._membership = membership
        # Endpoints added at runtime, with the zenoh id (= exo node id) found there.
        self._runtime_peers: dict[str, str] = {}

    async def run(self) -> None:
        """Re-introduce runtime peers whose link dropped (for example because they restarted)."""
        while True:
            await anyio.sleep(RECONNECT_INTERVAL_SECONDS)
            connected = self._connected_ids()
            for endpoint, zenoh_id in list(self._runtime_peers.items()):
                if zenoh_id not in connected:
                    try:
                        await self._introduce([endpoint])
                    except PeerUnreachableError as error:
                        logger.debug("runtime peer %s is still unreachable: %s", endpoint, error)

    async def add_peer(self, endpoint: str) -> PeerConnection:
        """Connect to `endpoint` (raises ClusterSettingsError if malformed, PeerUnreachableError if silent)."""
        endpoint = normalise_endpoint(endpoint)
        zenoh_id = await self._introduce([endpoint])
        self._runtime_peers[endpoint] = zenoh_id
        joined = await self._wait_for_member(zenoh_id)
        return PeerConnection(endpoint=endpoint, node_id=zenoh_id, joined=joined)

    async def discover(self) -> DiscoveryReport:
        """Scout the network once and connect to every exo-looking peer found that is not connected yet."""
        config = zenoh_config(self._settings, self._membership.node_id, discovery=True)
        hellos: list[zenoh.Hello] = []
        scout = await anyio.to_thread.run_sync(lambda: zenoh.scout(hellos.append, what="peer", config=config))
        await anyio.sleep(SCOUT_SECONDS)
        await anyio.to_thread.run_sync(scout.stop)
        found: dict[str, tuple[str, ...]] = {}
        for hello in hellos:
            if str(hello.zid) != self._membership.node_id:
                found[str(hello.zid)] = tuple(hello.locators)
        connected = self._connected_ids()
        peers: list[DiscoveredPeer] = []
        for zenoh_id, locators in sorted(found.items()):
            if zenoh_id not in connected:
                try:
                    await self._introduce(list(locators))
                except PeerUnreachableError as error:
                    logger.info("found %s at %s but could not connect: %s", zenoh_id, locators, error)
            member = NodeId(zenoh_id) in self._membership.view.live_nodes or await self._wait_for_member(zenoh_id)
            peers.append(DiscoveredPeer(node_id=zenoh_id, endpoints=list(locators), joined=member))
        return DiscoveryReport(found=peers)

    def _connected_ids(self) -> set[str]:
        return {str(zenoh_id) for zenoh_id in self._bus.session.info.peers_zid()}

    def _own_endpoints(self) -> list[str]:
        """This node's listeners as the helper session can dial them (a wildcard address means loopback)."""
        return [
            endpoint.replace("/0.0.0.0:", "/127.0.0.1:").replace("/[::]:", "/[::1]:")
            for endpoint in self._settings.listen
        ]

    async def _introduce(self, endpoints: list[str]) -> str:
        """Make this node and the peer at `endpoints` connect directly; return the peer's zenoh id."""
        own = self._own_endpoints()
        if not own:
            raise PeerUnreachableError("this node has no cluster listener to introduce")
        if set(endpoints) <= set(own):
            # Dialling our own listener twice only times out (slowly on a busy host): say what it is at once.
            raise PeerUnreachableError(f"{', '.join(endpoints)} is this node itself")
        helper_config = zenoh.Config()
        helper_config.insert_json5("mode", json.dumps("peer"))
        helper_config.insert_json5("listen/endpoints", "[]")
        dialled = [link_endpoint(endpoint, self._settings) for endpoint in endpoints + own]
        helper_config.insert_json5("connect/endpoints", json.dumps(dialled))
        helper_config.insert_json5("connect/timeout_ms", json.dumps(CONNECT_TIMEOUT_MILLISECONDS))
        helper_config.insert_json5("connect/exit_on_failure", "true")
        helper_config.insert_json5("scouting/multicast/enabled", "false")
        # The helper links only the two sides; what it learns from gossip is for them to act on, not for it.
        helper_config.insert_json5("scouting/gossip/autoconnect", json.dumps({"router": [], "peer": []}))
        apply_cluster_key(helper_config, self._settings)
        try:
            helper = await anyio.to_thread.run_sync(zenoh.open, helper_config)
        except zenoh.ZError as error:
            # zenoh's message lists this node's own listener beside the peer's: name only what the user asked for.
            raise PeerUnreachableError(f"nothing answered at {', '.join(endpoints)}") from error
        try:
            me = self._membership.node_id
            deadline = time.monotonic() + LINK_WAIT_SECONDS
            while True:
                reached = {str(zenoh_id) for zenoh_id in helper.info.peers_zid()}
                if reached - {me}:
                    peer = (reached - {me}).pop()
                    break
                if time.monotonic() > deadline:
                    if reached == {me}:
                        raise PeerUnreachableError(f"{', '.join(endpoints)} is this node itself")
                    raise PeerUnreachableError(f"nothing answered at {', '.join(endpoints)}")
                await anyio.sleep(0.05)
            while peer not in self._connected_ids() and time.monotonic() < deadline:
                await anyio.sleep(0.05)
            return peer
        finally:
            await anyio.to_thread.run_sync(helper.close)

    async def _wait_for_member(self, zenoh_id: str) -> bool:
        """True once the node with `zenoh_id` holds a token in this cluster (False: another cluster, or not exo)."""
        deadline = time.monotonic() + MEMBER_WAIT_SECONDS
        while NodeId(zenoh_id) not in self._membership.view.live_nodes:
            if time.monotonic() > deadline:
                return False
            await anyio.sleep(0.05)
        return True
